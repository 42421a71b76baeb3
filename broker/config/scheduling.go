package config

import (
	"fmt"
	"regexp"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
)

// Bounds on the scheduling fields.
const (
	maxGPUCount        = 1_000_000
	maxWeight          = 1_000_000
	maxShare           = 1_000_000
	maxSharers         = 64
	maxPreemptionLimit = 1000
	minDecayTime       = time.Minute
	maxDecayTime       = 365 * 24 * time.Hour
)

var labelKeyRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$`)

// validateScheduling checks the scheduler's tuning, the teams and their
// quotas; add records one problem under its field path.
func (c *Config) validateScheduling(add func(field, code, format string, args ...any)) {
	sc := c.Scheduler
	durations := []struct {
		field string
		d     broker.Duration
	}{
		{"scheduler.fairShareHalfLife", sc.FairShareHalfLife},
		{"scheduler.maxAge", sc.MaxAge},
		{"scheduler.starvationAge", sc.StarvationAge},
	}
	for _, d := range durations {
		if d.d.D() < minDecayTime || d.d.D() > maxDecayTime {
			add(d.field, broker.CodeOutOfRange, "must be between 1m and 365d, got %s", d.d)
		}
	}
	weights := []struct {
		field string
		w     int
	}{
		{"scheduler.weights.age", sc.Weights.Age},
		{"scheduler.weights.fairShare", sc.Weights.FairShare},
		{"scheduler.weights.size", sc.Weights.Size},
	}
	for _, w := range weights {
		if w.w < 0 || w.w > maxWeight {
			add(w.field, broker.CodeOutOfRange, "must be between 0 and %d, got %d", maxWeight, w.w)
		}
	}
	if sc.PreemptionLimit < 0 || sc.PreemptionLimit > maxPreemptionLimit {
		add("scheduler.preemptionLimit", broker.CodeOutOfRange, "must be between 0 (no limit) and %d, got %d", maxPreemptionLimit, sc.PreemptionLimit)
	}
	if sc.MaxSharersPerGPU < 1 || sc.MaxSharersPerGPU > maxSharers {
		add("scheduler.maxSharersPerGPU", broker.CodeOutOfRange, "must be between 1 and %d, got %d", maxSharers, sc.MaxSharersPerGPU)
	}
	if !labelKeyRe.MatchString(sc.GangLabel) {
		add("scheduler.gangLabel", broker.CodeInvalid, "must be a node label key: 1-63 letters, digits, '.', '_', '-' or '/'")
	}

	teams := map[string]bool{}
	for i, t := range c.Teams {
		f := fmt.Sprintf("teams[%d]", i)
		if !nameRe.MatchString(t.Name) {
			add(f+".name", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
		} else if teams[t.Name] {
			add(f+".name", broker.CodeInvalid, "duplicate team %q", t.Name)
		}
		teams[t.Name] = true
		if !(t.Share > 0 && t.Share <= maxShare) {
			add(f+".share", broker.CodeOutOfRange, "must be greater than 0 and at most %d, got %g", maxShare, t.Share)
		}
		if t.Quota != nil {
			checkQuota(add, f+".quota", t.Quota.GPUs, t.Quota.BorrowLimit)
		}
		for k, b := range t.Buckets {
			if err := broker.CheckBucket(b); err != nil {
				add(fmt.Sprintf("%s.buckets[%d]", f, k), broker.CodeInvalid, "%s", err.Error())
			}
		}
		projects := map[string]bool{}
		for k, p := range t.Projects {
			pf := fmt.Sprintf("%s.projects[%d]", f, k)
			if !nameRe.MatchString(p.Name) {
				add(pf+".name", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
			} else if projects[p.Name] {
				add(pf+".name", broker.CodeInvalid, "duplicate project %q in team %s", p.Name, t.Name)
			}
			projects[p.Name] = true
			checkQuota(add, pf, p.GPUs, p.BorrowLimit)
		}
	}
}

func checkQuota(add func(field, code, format string, args ...any), f string, gpus int, borrow *int) {
	if gpus < 0 || gpus > maxGPUCount {
		add(f+".gpus", broker.CodeOutOfRange, "must be between 0 and %d, got %d", maxGPUCount, gpus)
	}
	if borrow != nil && (*borrow < 0 || *borrow > maxGPUCount) {
		add(f+".borrowLimit", broker.CodeOutOfRange, "must be between 0 and %d, got %d", maxGPUCount, *borrow)
	}
}

// Policy is the part of the configuration the scheduler core applies.
func (c *Config) Policy() sched.Policy {
	sc := c.Scheduler
	p := sched.Policy{
		Priorities:        map[string]int{},
		Queues:            map[string]sched.QueuePolicy{},
		Weights:           sched.Weights{Age: sc.Weights.Age, FairShare: sc.Weights.FairShare, Size: sc.Weights.Size},
		FairShareHalfLife: sc.FairShareHalfLife.D(),
		MaxAge:            sc.MaxAge.D(),
		StarvationAge:     sc.StarvationAge.D(),
		PreemptionLimit:   sc.PreemptionLimit,
		MaxSharersPerGPU:  sc.MaxSharersPerGPU,
		GangLabel:         sc.GangLabel,
	}
	for _, pr := range c.Priorities {
		p.Priorities[pr.Name] = pr.Value
	}
	for _, q := range c.Queues {
		kind := sched.Batch
		if q.Kind == QueueLatency {
			kind = sched.Latency
		}
		p.Queues[q.Name] = sched.QueuePolicy{Kind: kind, Reserved: q.Reserved, Sharing: q.Sharing}
	}
	for _, t := range c.Teams {
		tp := sched.TeamPolicy{Share: t.Share}
		if t.Quota != nil {
			tp.Quota = &sched.Quota{GPUs: t.Quota.GPUs, BorrowLimit: copyInt(t.Quota.BorrowLimit)}
		}
		if len(t.Projects) > 0 {
			tp.Projects = map[string]sched.Quota{}
			for _, pr := range t.Projects {
				tp.Projects[pr.Name] = sched.Quota{GPUs: pr.GPUs, BorrowLimit: copyInt(pr.BorrowLimit)}
			}
		}
		if p.Teams == nil {
			p.Teams = map[string]sched.TeamPolicy{}
		}
		p.Teams[t.Name] = tp
	}
	return p
}

func copyInt(p *int) *int {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
