package config

import (
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Telemetry sets how long GPU time series are kept.
type Telemetry struct {
	// MinuteRetention keeps 1-minute points this long (default 7d).
	MinuteRetention broker.Duration `json:"minuteRetention,omitempty"`
	// HourRetention keeps hourly points this long (default 90d).
	HourRetention broker.Duration `json:"hourRetention,omitempty"`
}

// Idle is the policy for jobs that hold GPUs without computing.
type Idle struct {
	// Threshold is the compute utilisation (percent) under which a job's
	// cards count as idle (default 5).
	Threshold int `json:"threshold,omitempty"`
	// Window is how long the cards must stay under it (default 30m).
	Window broker.Duration `json:"window,omitempty"`
	// Reclaim lists the queues whose idle jobs are ended with reason
	// idle_reclaimed; in every other queue an idle job is only reported.
	Reclaim []string `json:"reclaim,omitempty"`
}

func (c *Config) observeDefaults() {
	if c.Telemetry.MinuteRetention == 0 {
		c.Telemetry.MinuteRetention = broker.Duration(7 * 24 * time.Hour)
	}
	if c.Telemetry.HourRetention == 0 {
		c.Telemetry.HourRetention = broker.Duration(90 * 24 * time.Hour)
	}
	if c.Idle.Threshold == 0 {
		c.Idle.Threshold = 5
	}
	if c.Idle.Window == 0 {
		c.Idle.Window = broker.Duration(30 * time.Minute)
	}
	c.reportsDefaults()
}

func (c *Config) validateObserve(add func(field, code, format string, args ...any)) {
	if c.Telemetry.MinuteRetention.D() < time.Hour {
		add("telemetry.minuteRetention", broker.CodeOutOfRange, "must be at least 1h")
	}
	if c.Telemetry.HourRetention.D() < c.Telemetry.MinuteRetention.D() {
		add("telemetry.hourRetention", broker.CodeOutOfRange, "must be at least telemetry.minuteRetention")
	}
	if c.Idle.Threshold < 1 || c.Idle.Threshold > 100 {
		add("idle.threshold", broker.CodeOutOfRange, "must be between 1 and 100 (percent)")
	}
	if c.Idle.Window.D() < time.Second {
		add("idle.window", broker.CodeOutOfRange, "must be at least 1s")
	}
	for i, q := range c.Idle.Reclaim {
		if _, ok := c.Queue(q); !ok {
			add(fmt.Sprintf("idle.reclaim[%d]", i), broker.CodeInvalid, "unknown queue %q", q)
		}
	}
	c.validateReports(add)
}

// ReclaimsIdle reports whether idle jobs of a queue are ended.
func (c *Config) ReclaimsIdle(queue string) bool {
	for _, q := range c.Idle.Reclaim {
		if q == queue {
			return true
		}
	}
	return false
}
