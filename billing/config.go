package billing

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Config is the `billing:` section of the broker config, as written in
// YAML (see docs/billing.md for the full shape). Compile checks it and
// turns it into what the meter, the reports and the export runner use.
type Config struct {
	// Currency of every price; "USD" when empty.
	Currency string `json:"currency,omitempty"`
	// Slice is the metering grid ("60s" when empty).
	Slice Duration `json:"slice,omitempty"`
	// AccountID and AccountName fill FOCUS BillingAccountId/Name.
	AccountID   string `json:"accountId,omitempty"`
	AccountName string `json:"accountName,omitempty"`
	// TimeZone cuts budget months and the default report days and months
	// (IANA name; "UTC" when empty).
	TimeZone string `json:"timeZone,omitempty"`
	// Overhead is who pays for idle burst GPUs.
	Overhead OverheadConfig `json:"overhead,omitempty"`
	// OnPrem holds the amortised on-prem rates.
	OnPrem OnPremConfig `json:"onprem,omitempty"`
	// Exports are the scheduled exports.
	Exports []ExportConfig `json:"exports,omitempty"`
	// Retry is the scheduled exports' retry policy (DefaultBackoff when
	// absent).
	Retry *BackoffConfig `json:"retry,omitempty"`
}

// OverheadConfig is who pays for idle burst GPUs.
type OverheadConfig struct {
	// ChargeTo is "account" (default) or "demand-team".
	ChargeTo string `json:"chargeTo,omitempty"`
	// Account is the overhead account's team name ("burst-overhead").
	Account string `json:"account,omitempty"`
}

// OnPremConfig holds the amortised on-prem rates.
type OnPremConfig struct {
	// Rates per GPU model, each a list of prices with effective times.
	Rates map[string][]Price `json:"rates,omitempty"`
	// DefaultRate prices GPU models Rates does not list.
	DefaultRate []Price `json:"defaultRate,omitempty"`
}

// ExportConfig is one scheduled export.
type ExportConfig struct {
	// Name names files and marks: 1-63 of a-z, 0-9, '.', '_', '-'.
	Name string `json:"name"`
	// Schedule is a robfig/cron standard spec ("0 6 1 * *", "@daily").
	Schedule string `json:"schedule"`
	// TimeZone the schedule fires in and periods are cut in (UTC default).
	TimeZone string `json:"timeZone,omitempty"`
	// Period is previous-day or previous-month.
	Period string `json:"period"`
	// Format is csv (default) or json.
	Format string `json:"format,omitempty"`
	// Granularity is entry, hour (default) or day.
	Granularity string `json:"granularity,omitempty"`
	// Team restricts the export to one team.
	Team string `json:"team,omitempty"`
	// CatchUp caps missed periods run at once (DefaultCatchUp when 0).
	CatchUp int `json:"catchUp,omitempty"`
	// Destination is a dir or an S3 bucket.
	Destination Destination `json:"destination"`
}

// BackoffConfig is the retry policy of scheduled exports.
type BackoffConfig struct {
	// Attempts, Initial and Max are those of Backoff.
	Attempts int      `json:"attempts,omitempty"`
	Initial  Duration `json:"initial,omitempty"`
	Max      Duration `json:"max,omitempty"`
}

// Duration is a time.Duration written as "60s", "2m".
type Duration time.Duration

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"60s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// ConfigError is one bad field of the billing config; it wraps
// ErrInvalidConfig. Field is the path from the broker config's root
// ("billing.exports[0].schedule").
type ConfigError struct {
	Field   string
	Message string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidConfig, e.Field, e.Message)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Compiled is a checked Config.
type Compiled struct {
	// Meter is what Meter and MeterCycle take.
	Meter MeterConfig
	// Exports are the scheduled exports, schedules parsed.
	Exports []ScheduledExport
	// TimeZone cuts budget months (BurstSpend) and default report days.
	TimeZone *time.Location
	// BillingAccountID and BillingAccountName go to Runner and exports.
	BillingAccountID   string
	BillingAccountName string
	// Retry goes to Runner.Retry.
	Retry Backoff
}

// ParseConfig reads a `billing:` section body from YAML, refusing unknown
// fields, and compiles it.
func ParseConfig(doc []byte) (Config, Compiled, error) {
	var c Config
	if err := yaml.UnmarshalStrict(doc, &c); err != nil {
		return Config{}, Compiled{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	comp, err := c.Compile()
	return c, comp, err
}

// Compile checks every field and parses every cron schedule and time zone
// once. The error joins one error per bad field, each wrapping
// ErrInvalidConfig and naming the field ("billing.exports[0].schedule").
func (c Config) Compile() (Compiled, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: "billing." + field, Message: fmt.Sprintf(format, args...)})
	}
	out := Compiled{BillingAccountID: c.AccountID, BillingAccountName: c.AccountName, Retry: DefaultBackoff}
	if out.BillingAccountID == "" {
		out.BillingAccountID = "spillway"
	}
	cur := c.Currency
	if cur == "" {
		cur = "USD"
	}
	if len(cur) != 3 || strings.ToUpper(cur) != cur {
		bad("currency", "%q is not an ISO 4217 code like USD", cur)
	}
	out.Meter = MeterConfig{Slice: time.Duration(c.Slice), Currency: cur}
	if s := out.Meter.slice(); s < time.Second || s > time.Hour || time.Hour%s != 0 || s%time.Millisecond != 0 {
		bad("slice", "%s must be between 1s and 1h and divide one hour", s)
	}
	out.TimeZone = loadZone(c.TimeZone, "timeZone", bad)

	switch OverheadCharge(c.Overhead.ChargeTo) {
	case "", ChargeAccount:
		out.Meter.Overhead.ChargeTo = ChargeAccount
	case ChargeDemandTeam:
		out.Meter.Overhead.ChargeTo = ChargeDemandTeam
	default:
		bad("overhead.chargeTo", "%q is not account or demand-team", c.Overhead.ChargeTo)
	}
	out.Meter.Overhead.Account = c.Overhead.Account
	if out.Meter.Overhead.Account == "" {
		out.Meter.Overhead.Account = DefaultOverheadAccount
	}

	out.Meter.OnPrem.ByModel = map[string]PriceSchedule{}
	for _, model := range sortedKeys(c.OnPrem.Rates) {
		s := normalise(c.OnPrem.Rates[model])
		if model == "" {
			bad("onprem.rates", "empty GPU model name")
		}
		if len(s) == 0 {
			bad("onprem.rates."+model, "no prices")
		}
		if err := s.Validate(); err != nil {
			bad("onprem.rates."+model, "%v", err)
		}
		out.Meter.OnPrem.ByModel[model] = s
	}
	out.Meter.OnPrem.Default = normalise(c.OnPrem.DefaultRate)
	if err := out.Meter.OnPrem.Default.Validate(); err != nil {
		bad("onprem.defaultRate", "%v", err)
	}

	if c.Retry != nil {
		r := Backoff{Attempts: c.Retry.Attempts, Initial: time.Duration(c.Retry.Initial), Max: time.Duration(c.Retry.Max)}
		if r.Attempts < 1 || r.Attempts > 100 {
			bad("retry.attempts", "%d is outside 1..100", r.Attempts)
		}
		if r.Initial <= 0 || r.Max < r.Initial {
			bad("retry", "initial must be positive and max at least initial")
		}
		out.Retry = r
	}

	seen := map[string]bool{}
	for i, x := range c.Exports {
		f := fmt.Sprintf("exports[%d]", i)
		if !exportName.MatchString(x.Name) {
			bad(f+".name", "%q must be 1-63 of a-z, 0-9, '.', '_', '-'", x.Name)
		}
		if seen[x.Name] {
			bad(f+".name", "%q is used twice", x.Name)
		}
		seen[x.Name] = true
		se := ScheduledExport{Name: x.Name, Spec: x.Schedule, Period: PeriodKind(x.Period), CatchUp: x.CatchUp,
			Format: Format(x.Format), Granularity: Granularity(x.Granularity), Team: x.Team, Destination: x.Destination}
		sched, err := ParseSchedule(x.Schedule)
		if err != nil {
			bad(f+".schedule", "%v", err)
		}
		se.Schedule = sched
		se.Location = loadZone(x.TimeZone, f+".timeZone", bad)
		if se.Period != PreviousDay && se.Period != PreviousMonth {
			bad(f+".period", "%q is not previous-day or previous-month", x.Period)
		}
		if se.Format == "" {
			se.Format = FormatCSV
		}
		if se.Format != FormatCSV && se.Format != FormatJSON {
			bad(f+".format", "%q is not csv or json", x.Format)
		}
		if se.Granularity == "" {
			se.Granularity = GranularityHour
		}
		switch se.Granularity {
		case GranularityEntry, GranularityHour, GranularityDay:
		default:
			bad(f+".granularity", "%q is not entry, hour or day", x.Granularity)
		}
		if x.CatchUp < 0 || x.CatchUp > 1000 {
			bad(f+".catchUp", "%d is outside 0..1000", x.CatchUp)
		}
		d := x.Destination
		switch {
		case (d.Dir == "") == (d.S3 == nil):
			bad(f+".destination", "set exactly one of dir and s3")
		case d.S3 != nil && d.S3.Bucket == "":
			bad(f+".destination.s3.bucket", "required")
		}
		out.Exports = append(out.Exports, se)
	}
	if len(errs) > 0 {
		return Compiled{}, errors.Join(errs...)
	}
	return out, nil
}

func loadZone(name, field string, bad func(string, string, ...any)) *time.Location {
	if name == "" {
		return time.UTC
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		bad(field, "unknown time zone %q", name)
		return time.UTC
	}
	return loc
}

// normalise puts prices' times in UTC, whole milliseconds, as the meter
// cuts slices in milliseconds.
func normalise(s []Price) PriceSchedule {
	out := make(PriceSchedule, len(s))
	for i, p := range s {
		out[i] = Price{From: utcMilli(p.From), PerGPUHour: p.PerGPUHour}
	}
	return out
}
