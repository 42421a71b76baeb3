package billing

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Format is an export file format.
type Format string

// Export formats.
const (
	FormatCSV  Format = "csv"
	FormatJSON Format = "json"
)

// Granularity is how finely an export's rows cut time.
type Granularity string

// Export granularities.
const (
	// GranularityEntry writes one row per ledger entry.
	GranularityEntry Granularity = "entry"
	// GranularityHour sums the entries of one UTC hour that agree on every
	// column but the times (same job, attempt, resource, rate, …).
	GranularityHour Granularity = "hour"
	// GranularityDay does the same per UTC day.
	GranularityDay Granularity = "day"
)

// ExportOptions says what to export and how.
type ExportOptions struct {
	// Format is csv or json.
	Format Format
	// Granularity defaults to GranularityHour.
	Granularity Granularity
	// Period selects entries by Start.
	Period Period
	// Team restricts the export to one team; empty exports every team.
	Team string
	// BillingAccountID and BillingAccountName fill the FOCUS billing
	// account columns (the organisation running Spillway).
	BillingAccountID   string
	BillingAccountName string
}

// ExportSummary describes a written export.
type ExportSummary struct {
	// Rows written, header excluded.
	Rows int
	// Currency of the amounts (empty when no row).
	Currency string
	// Totals is kept equal to the sum of the exported rows, and so to
	// LedgerTotals for the same period and team.
	Totals Totals
}

// Column is one export column.
type Column struct {
	// Name is the header: a FOCUS column name, or an x_ name of ours.
	Name string
	// FOCUS is true when the column is defined by the FOCUS specification.
	FOCUS bool
	// Numeric columns are JSON numbers in the JSON export.
	Numeric bool
	// Doc says what it holds, for docs/billing.md and `spillway bill
	// columns`.
	Doc   string
	value func(r *exportRow, o *ExportOptions) (v string, null bool)
}

// FOCUS names of the units and categories we emit.
const (
	focusChargeCategoryUsage = "Usage"
	focusChargeFrequency     = "Usage-Based"
	focusServiceCategory     = "Compute"
	focusServiceName         = "Spillway GPU"
	focusConsumedUnit        = "GPU-Seconds"
	focusPricingUnit         = "GPU-Hours"
	focusOnPremProvider      = "On-Premises"
)

func str(s string) (string, bool) { return s, s == "" }

// Columns are the export's columns in file order: FOCUS columns first (in
// alphabetical order), then ours, prefixed x_ as FOCUS asks of custom
// columns.
var Columns = []Column{
	{Name: "BilledCost", FOCUS: true, Numeric: true, Doc: "cost of the row (sum of the entries' Cost)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.cost.String(), false }},
	{Name: "BillingAccountId", FOCUS: true, Doc: "billing.accountId from config: the organisation running Spillway",
		value: func(_ *exportRow, o *ExportOptions) (string, bool) { return str(o.BillingAccountID) }},
	{Name: "BillingAccountName", FOCUS: true, Doc: "billing.accountName from config",
		value: func(_ *exportRow, o *ExportOptions) (string, bool) { return str(o.BillingAccountName) }},
	{Name: "BillingCurrency", FOCUS: true, Doc: "ISO 4217 currency of every amount in the row",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.currency) }},
	{Name: "BillingPeriodEnd", FOCUS: true, Doc: "exclusive end of the UTC calendar month holding ChargePeriodStart",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) {
			return focusTime(r.billingPeriod().To), false
		}},
	{Name: "BillingPeriodStart", FOCUS: true, Doc: "start of the UTC calendar month holding ChargePeriodStart",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) {
			return focusTime(r.billingPeriod().From), false
		}},
	{Name: "ChargeCategory", FOCUS: true, Doc: "always Usage (overhead is usage of a machine nobody held)",
		value: func(*exportRow, *ExportOptions) (string, bool) { return focusChargeCategoryUsage, false }},
	{Name: "ChargeClass", FOCUS: true, Doc: "always null: the ledger is append-only and never corrects a row",
		value: func(*exportRow, *ExportOptions) (string, bool) { return "", true }},
	{Name: "ChargeDescription", FOCUS: true, Doc: "one line a person can read: what GPU-time, for whom, where",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.description(), false }},
	{Name: "ChargeFrequency", FOCUS: true, Doc: "always Usage-Based",
		value: func(*exportRow, *ExportOptions) (string, bool) { return focusChargeFrequency, false }},
	{Name: "ChargePeriodEnd", FOCUS: true, Doc: "exclusive end of the row's GPU-time (latest entry End)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return focusTime(r.end), false }},
	{Name: "ChargePeriodStart", FOCUS: true, Doc: "inclusive start of the row's GPU-time (earliest entry Start)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return focusTime(r.start), false }},
	{Name: "ConsumedQuantity", FOCUS: true, Numeric: true, Doc: "GPU-seconds, exact to the millisecond (GPUMillis / 1000)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return millisAsSeconds(r.gpuMillis), false }},
	{Name: "ConsumedUnit", FOCUS: true, Doc: "always GPU-Seconds",
		value: func(*exportRow, *ExportOptions) (string, bool) { return focusConsumedUnit, false }},
	{Name: "ContractedCost", FOCUS: true, Numeric: true, Doc: "equals BilledCost: rates are already the contracted ones",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.cost.String(), false }},
	{Name: "ContractedUnitPrice", FOCUS: true, Numeric: true, Doc: "price of one GPU-hour (the entries' Rate)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.k.rate.String(), false }},
	{Name: "EffectiveCost", FOCUS: true, Numeric: true, Doc: "equals BilledCost: no discounts or amortisation apply",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.cost.String(), false }},
	{Name: "InvoiceIssuerName", FOCUS: true, Doc: "equals ProviderName",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.provider(), false }},
	{Name: "ListCost", FOCUS: true, Numeric: true, Doc: "equals BilledCost (no list price is known apart from the rate)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.cost.String(), false }},
	{Name: "ListUnitPrice", FOCUS: true, Numeric: true, Doc: "equals ContractedUnitPrice",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.k.rate.String(), false }},
	{Name: "PricingCategory", FOCUS: true, Doc: "Dynamic for spot capacity, Standard otherwise",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) {
			if r.k.spot {
				return "Dynamic", false
			}
			return "Standard", false
		}},
	{Name: "PricingQuantity", FOCUS: true, Numeric: true, Doc: "GPU-hours rounded half up to 9 decimals (ConsumedQuantity is the exact one)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return millisAsHours9(r.gpuMillis), false }},
	{Name: "PricingUnit", FOCUS: true, Doc: "always GPU-Hours",
		value: func(*exportRow, *ExportOptions) (string, bool) { return focusPricingUnit, false }},
	{Name: "ProviderName", FOCUS: true, Doc: "the cloud or lessor (Pool.Provider); On-Premises for owned GPUs",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.provider(), false }},
	{Name: "PublisherName", FOCUS: true, Doc: "equals ProviderName",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.provider(), false }},
	{Name: "RegionId", FOCUS: true, Doc: "the provider's region; null on-prem",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.pool.Region) }},
	{Name: "RegionName", FOCUS: true, Doc: "equals RegionId",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.pool.Region) }},
	{Name: "ResourceId", FOCUS: true, Doc: "instance id of a burst machine, node name on-prem",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.pool.ResourceID()) }},
	{Name: "ResourceName", FOCUS: true, Doc: "the agent's node name (the instance id when it has none)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) {
			if r.k.pool.Node != "" {
				return r.k.pool.Node, false
			}
			return str(r.k.pool.ResourceID())
		}},
	{Name: "ResourceType", FOCUS: true, Doc: "GPU Node (onprem), GPU Instance (cloud) or Leased GPU Machine (lease)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) {
			switch r.k.pool.Kind {
			case PoolCloud:
				return "GPU Instance", false
			case PoolLease:
				return "Leased GPU Machine", false
			}
			return "GPU Node", false
		}},
	{Name: "ServiceCategory", FOCUS: true, Doc: "always Compute",
		value: func(*exportRow, *ExportOptions) (string, bool) { return focusServiceCategory, false }},
	{Name: "ServiceName", FOCUS: true, Doc: "always Spillway GPU",
		value: func(*exportRow, *ExportOptions) (string, bool) { return focusServiceName, false }},
	{Name: "SkuId", FOCUS: true, Doc: "what is priced: onprem/<GPU model>, or <kind>/<provider>/<instance type>[/spot]",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.sku(), false }},
	{Name: "SubAccountId", FOCUS: true, Doc: "the team charged; kept equal to x_Team",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.team) }},
	{Name: "SubAccountName", FOCUS: true, Doc: "the team charged",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.team) }},
	{Name: "Tags", FOCUS: true, Doc: `JSON object of the non-empty spillway/team, spillway/project, spillway/user, spillway/job, spillway/queue`,
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.tags(), false }},

	{Name: "x_EntryId", Doc: "the ledger entry id (entry granularity only; null for summed rows)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.entryID) }},
	{Name: "x_Entries", Numeric: true, Doc: "how many ledger entries the row sums",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return strconv.Itoa(r.entries), false }},
	{Name: "x_Kind", Doc: "usage or overhead",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return string(r.k.kind), false }},
	{Name: "x_Team", Doc: "the team charged",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.team) }},
	{Name: "x_Project", Doc: "the job's project",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.project) }},
	{Name: "x_User", Doc: "who submitted the job",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.user) }},
	{Name: "x_Job", Doc: "the job id",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.job) }},
	{Name: "x_Attempt", Numeric: true, Doc: "the job's run number; null for overhead",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) {
			if r.k.kind == KindOverhead {
				return "", true
			}
			return strconv.Itoa(r.k.attempt), false
		}},
	{Name: "x_Queue", Doc: "the job's queue (for overhead: the demand's queue when charged to the team)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.queue) }},
	{Name: "x_PoolKind", Doc: "onprem, cloud or lease",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return string(r.k.pool.Kind), false }},
	{Name: "x_Pool", Doc: "the pool label reports group by (onprem/<name>, cloud/<provider>/<region>/<type>)",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.k.pool.Label(), false }},
	{Name: "x_Node", Doc: "the agent's node name",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.pool.Node) }},
	{Name: "x_InstanceType", Doc: "the provider's machine type; null on-prem",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.pool.InstanceType) }},
	{Name: "x_InstanceId", Doc: "the provider's machine id; null on-prem",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return str(r.k.pool.InstanceID) }},
	{Name: "x_GPUModel", Doc: "GPU model",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return r.k.gpuModel, false }},
	{Name: "x_Spot", Doc: "true for spot / preemptible capacity",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return strconv.FormatBool(r.k.spot), false }},
	{Name: "x_EffectiveGPUSeconds", Numeric: true, Doc: "GPU-seconds spent computing: sum of GPU-time × utilisation per entry",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return millisAsSeconds(r.effective), false }},
	{Name: "x_MeasuredGPUSeconds", Numeric: true, Doc: "GPU-seconds covered by telemetry",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) { return millisAsSeconds(r.measured), false }},
	{Name: "x_GPUUtilization", Numeric: true, Doc: "x_EffectiveGPUSeconds / x_MeasuredGPUSeconds, 3 decimals; null without telemetry",
		value: func(r *exportRow, _ *ExportOptions) (string, bool) {
			if r.measured == 0 {
				return "", true
			}
			th := divRound(r.effective*1000, r.measured)
			return fmt.Sprintf("%d.%03d", th/1000, th%1000), false
		}},
}

// rowKey is what entries must share to be summed into one row.
type rowKey struct {
	kind                     Kind
	team, project, user, job string
	attempt                  int
	queue                    string
	pool                     Pool
	gpuModel                 string
	spot                     bool
	rate                     Amount
	currency                 string
}

func keyOf(e Entry) rowKey {
	return rowKey{e.Kind, e.Team, e.Project, e.User, e.Job, e.Attempt, e.Queue, e.Pool, e.GPUModel, e.Spot, e.Rate, e.Currency}
}

// sortString orders rows of one bucket deterministically.
func (k rowKey) sortString() string {
	p := k.pool
	return strings.Join([]string{string(k.kind), k.team, k.project, k.user, k.job, strconv.Itoa(k.attempt), k.queue,
		string(p.Kind), p.Name, p.Node, p.Provider, p.Region, p.InstanceType, p.InstanceID,
		k.gpuModel, strconv.FormatBool(k.spot), strconv.FormatInt(int64(k.rate), 10), k.currency}, "\x00")
}

// exportRow is one output row: one entry, or the sum of entries that share
// a rowKey within a bucket.
type exportRow struct {
	k          rowKey
	currency   string
	entryID    string
	start, end time.Time
	entries    int
	gpuMillis  int64
	effective  int64
	measured   int64
	cost       Amount
	month      Period // BillingPeriod, computed once
	sortKey    string // k.sortString(), computed once per flush
}

func (r *exportRow) add(e Entry) {
	if r.entries == 0 || e.Start.Before(r.start) {
		r.start = e.Start
	}
	if r.entries == 0 || e.End.After(r.end) {
		r.end = e.End
	}
	r.entries++
	r.gpuMillis += e.GPUMillis
	r.effective += e.EffectiveGPUMillis()
	r.measured += e.MeasuredGPUMillis()
	r.cost += e.Cost
	r.currency = e.Currency
}

func (r *exportRow) provider() string {
	if r.k.pool.Kind == PoolOnPrem || r.k.pool.Provider == "" {
		return focusOnPremProvider
	}
	return r.k.pool.Provider
}

func (r *exportRow) sku() string {
	p := r.k.pool
	if p.Kind == PoolOnPrem {
		return "onprem/" + r.k.gpuModel
	}
	s := string(p.Kind) + "/" + p.Provider + "/" + p.InstanceType
	if r.k.spot {
		s += "/spot"
	}
	return s
}

func (r *exportRow) tags() string {
	// keys in sorted order, as a JSON object; empty values left out
	var b strings.Builder
	b.WriteByte('{')
	for _, kv := range [...][2]string{{"spillway/job", r.k.job}, {"spillway/project", r.k.project}, {"spillway/queue", r.k.queue}, {"spillway/team", r.k.team}, {"spillway/user", r.k.user}} {
		if kv[1] == "" {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(jsonString(kv[0]))
		b.WriteByte(':')
		b.WriteString(jsonString(kv[1]))
	}
	b.WriteByte('}')
	return b.String()
}

// jsonString quotes s as a JSON string: plain printable ASCII directly,
// anything else through encoding/json.
func jsonString(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always marshals
			return string(b)
		}
	}
	return `"` + s + `"`
}

func (r *exportRow) billingPeriod() Period {
	if r.month.From.IsZero() {
		r.month = MonthOf(r.start, time.UTC)
	}
	return r.month
}

func (r *exportRow) description() string {
	where := r.k.pool.Label()
	if id := r.k.pool.ResourceID(); id != "" {
		where += " " + id
	}
	if r.k.kind == KindOverhead {
		return fmt.Sprintf("Unallocated %s GPU time (boot, bootstrap, idle) on burst machine %s", r.k.gpuModel, where)
	}
	return fmt.Sprintf("%s GPU time of job %s attempt %d on %s", r.k.gpuModel, r.k.job, r.k.attempt, where)
}

// Export writes the period's entries as CSV or JSON with FOCUS column
// names. The same ledger and options give byte-identical output, and the
// rows' BilledCost adds up exactly to LedgerTotals for the period and team
// (returned in the summary as a cross-check).
func Export(ctx context.Context, s Store, w io.Writer, o ExportOptions) (ExportSummary, error) {
	if err := o.Period.Validate(); err != nil {
		return ExportSummary{}, err
	}
	if o.Granularity == "" {
		o.Granularity = GranularityHour
	}
	var bucket time.Duration
	switch o.Granularity {
	case GranularityEntry:
	case GranularityHour:
		bucket = time.Hour
	case GranularityDay:
		bucket = 24 * time.Hour
	default:
		return ExportSummary{}, fmt.Errorf("%w: granularity %q is not entry, hour or day", ErrBadQuery, o.Granularity)
	}
	var out rowWriter
	bw := bufio.NewWriter(w)
	switch o.Format {
	case FormatCSV:
		out = &csvRows{w: csv.NewWriter(bw), o: &o}
	case FormatJSON:
		out = &jsonRows{w: bw, o: &o}
	default:
		return ExportSummary{}, fmt.Errorf("%w: format %q is not csv or json", ErrBadQuery, o.Format)
	}

	var sum ExportSummary
	if err := out.begin(); err != nil {
		return sum, fmt.Errorf("write export: %w", err)
	}
	// Entries arrive in Start order, so UTC buckets arrive one after the
	// other: hold one bucket's rows, flush them sorted when the next begins.
	var cur time.Time
	rows := map[rowKey]*exportRow{}
	flush := func() error {
		sorted := make([]*exportRow, 0, len(rows))
		for _, r := range rows {
			r.sortKey = r.k.sortString()
			sorted = append(sorted, r)
		}
		slices.SortFunc(sorted, func(a, b *exportRow) int {
			if c := a.start.Compare(b.start); c != 0 {
				return c
			}
			return strings.Compare(a.sortKey, b.sortKey)
		})
		for _, r := range sorted {
			if err := out.row(r); err != nil {
				return err
			}
			sum.Rows++
		}
		clear(rows)
		return nil
	}
	err := s.Scan(ctx, o.Period.From, o.Period.To, func(e Entry) error {
		if o.Team != "" && e.Team != o.Team {
			return nil
		}
		if err := sameCurrency(&sum.Currency, e); err != nil {
			return err
		}
		sum.Totals.Add(e)
		if bucket == 0 {
			r := exportRow{k: keyOf(e), entryID: e.ID}
			r.add(e)
			sum.Rows++
			return out.row(&r)
		}
		if b := e.Start.Truncate(bucket); !b.Equal(cur) {
			if err := flush(); err != nil {
				return err
			}
			cur = b
		}
		k := keyOf(e)
		r, ok := rows[k]
		if !ok {
			r = &exportRow{k: k}
			rows[k] = r
		}
		r.add(e)
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err == nil {
		err = out.end()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return sum, fmt.Errorf("export %s: %w", o.Period.Label(), err)
	}
	return sum, nil
}

type rowWriter interface {
	begin() error
	row(r *exportRow) error
	end() error
}

type csvRows struct {
	w   *csv.Writer
	o   *ExportOptions
	rec []string
}

func (c *csvRows) begin() error {
	head := make([]string, len(Columns))
	for i, col := range Columns {
		head[i] = col.Name
	}
	c.rec = make([]string, len(Columns))
	return c.w.Write(head)
}

func (c *csvRows) row(r *exportRow) error {
	for i, col := range Columns {
		v, null := col.value(r, c.o)
		if null {
			v = ""
		}
		c.rec[i] = v
	}
	return c.w.Write(c.rec)
}

func (c *csvRows) end() error {
	c.w.Flush()
	return c.w.Error()
}

// jsonRows writes a JSON array with one object per line, keys in column
// order, numbers as exact decimal literals (parse them with a decimal type
// such as json.Number, never float64, to keep the sums exact).
type jsonRows struct {
	w     *bufio.Writer
	o     *ExportOptions
	count int
	names []string // quoted column names with their colon
}

func (j *jsonRows) begin() error {
	_, err := j.w.WriteString("[")
	return err
}

func (j *jsonRows) row(r *exportRow) error {
	if j.names == nil {
		j.names = make([]string, len(Columns))
		for i, col := range Columns {
			j.names[i] = jsonString(col.Name) + ":"
		}
	}
	if j.count > 0 {
		j.w.WriteByte(',')
	}
	j.count++
	j.w.WriteString("\n{")
	for i, col := range Columns {
		if i > 0 {
			j.w.WriteByte(',')
		}
		j.w.WriteString(j.names[i])
		v, null := col.value(r, j.o)
		switch {
		case null:
			j.w.WriteString("null")
		case col.Numeric, col.Name == "Tags": // Tags is already a JSON object
			j.w.WriteString(v)
		default:
			j.w.WriteString(jsonString(v))
		}
	}
	_, err := j.w.WriteString("}")
	return err
}

func (j *jsonRows) end() error {
	_, err := j.w.WriteString("\n]\n")
	return err
}

// focusTime prints an instant as FOCUS wants it: ISO 8601 in UTC, with
// milliseconds only when there are some.
func focusTime(t time.Time) string {
	t = t.UTC()
	if t.Nanosecond() == 0 {
		return t.Format("2006-01-02T15:04:05Z")
	}
	return t.Format("2006-01-02T15:04:05.000Z")
}

func millisAsSeconds(ms int64) string {
	sign := ""
	if ms < 0 {
		sign, ms = "-", -ms
	}
	return fmt.Sprintf("%s%d.%03d", sign, ms/1000, ms%1000)
}

// millisAsHours9 is ms in hours, rounded half up to 9 decimals:
// ms / 3_600_000 h = ms·2500/9 nano-hours.
func millisAsHours9(ms int64) string {
	n := divRound(ms*2500, 9)
	return fmt.Sprintf("%d.%09d", n/1_000_000_000, n%1_000_000_000)
}
