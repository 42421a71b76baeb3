package report

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/config"
)

// The utilisation report: per team, pool, GPU model and shift, the
// GPU-hours allocated and computing (from the billing ledger, so they
// reconcile with it to the GPU-millisecond) and the GPU memory held (from
// the telemetry series, each card's memory attributed to the jobs that
// held the card); then the jobs that hold memory without computing and the
// cards idle longest.

// BucketAllocHistory keeps a copy of every allocation record (job attempt
// × node, with its cards), keyed "<start ms>/<job>/<attempt>/<node>": the
// meter deletes its own records once metered, while reports need to know
// who held which card for as long as telemetry is kept. The broker writes
// it with each commit that gives or takes back GPUs.
const BucketAllocHistory broker.Bucket = "alloc-history"

// idleCard is a card of the report while it is summed: the stretch under
// the threshold it is in.
type idleCard struct {
	api.IdleCard
	runStart, runEnd time.Time
}

// idleHolder is a job of the report while it is summed: its memory over
// the idle card-time.
type idleHolder struct {
	api.IdleHolder
	memSeconds float64
}

// idleMemoryFloor is the memory in use above which an idle card counts as
// held without computing (a CUDA context alone takes a few hundred MiB).
const idleMemoryFloor = 1 << 30

// reportListLimit bounds the idle lists.
const reportListLimit = 20

// shiftPieces cuts [from, to) at every shift change and calls fn with each
// piece.
func shiftPieces(r *config.Reports, from, to time.Time, fn func(shift string, s, e time.Time)) {
	for s := from; s.Before(to); {
		e := r.NextShiftChange(s)
		if e.After(to) {
			e = to
		}
		fn(r.ShiftOf(s), s, e)
		s = e
	}
}

// share is the integer part of total that piece [0, upTo] of a span takes
// cumulatively: successive differences split total exactly.
func share(total int64, upTo, span time.Duration) int64 {
	if span <= 0 {
		return total
	}
	return int64(billing.Amount(total).MulDiv(int64(upTo), int64(span)))
}

// heldCard is one allocation's hold on one card.
type heldCard struct {
	job, team, pool, model string
	start, end             time.Time // end zero: still held
	milli                  int64     // thousandths of the card
}

// card names one GPU: its node and index.
type card struct {
	node string
	gpu  int
}

// Utilization builds the utilisation report of a period, of one team or
// all when team is empty, at resolution res ("": minutes while the
// period's start is within the minute series' retention, else hours).
// It reads the ledger, the allocation history and the telemetry series
// from the store, and the jobs' data waits from the view.
func (rs *Reports) Utilization(ctx context.Context, p billing.Period, team string, res broker.Resolution) (*api.UtilizationReport, error) {
	now := rs.Clock.Now()
	r := &rs.Config.Reports
	if res == "" {
		res = broker.Minute
		if p.From.Before(now.Add(-rs.Config.Telemetry.MinuteRetention.D() + time.Minute)) {
			res = broker.Hour
		}
	}
	threshold := rs.Config.Idle.Threshold
	rep := &api.UtilizationReport{Period: p, Team: team, Resolution: res, IdleThreshold: threshold, Rows: []api.UtilRow{},
		IdleHolders: []api.IdleHolder{}, IdleCards: []api.IdleCard{},
		Shifts: api.ShiftRules{TimeZone: r.Location().String(), DayStart: *r.DayStart, DayEnd: *r.DayEnd, Weekend: r.Weekend}}
	type rowKey struct{ team, pool, model, shift string }
	rows := map[rowKey]*api.UtilTotals{}
	row := func(k rowKey) *api.UtilTotals {
		t := rows[k]
		if t == nil {
			t = &api.UtilTotals{}
			rows[k] = t
		}
		return t
	}

	// 1. Allocated and computing GPU-time: the ledger, split by shift.
	err := broker.Ledger{Store: rs.Store}.Scan(ctx, p.From, p.To, func(e billing.Entry) error {
		if team != "" && e.Team != team {
			return nil
		}
		if rep.Currency == "" {
			rep.Currency = e.Currency
		}
		span := e.End.Sub(e.Start)
		eff, meas := e.EffectiveGPUMillis(), e.MeasuredGPUMillis()
		var done time.Duration
		shiftPieces(r, e.Start, e.End, func(shift string, a, b time.Time) {
			prev, cur := done, done+b.Sub(a)
			done = cur
			t := row(rowKey{e.Team, e.Pool.Label(), e.GPUModel, shift})
			ms := share(e.GPUMillis, cur, span) - share(e.GPUMillis, prev, span)
			t.GPUMillis += ms
			if e.Kind == billing.KindOverhead {
				t.OverheadGPUMillis += ms
			}
			t.EffectiveGPUMillis += share(eff, cur, span) - share(eff, prev, span)
			t.MeasuredGPUMillis += share(meas, cur, span) - share(meas, prev, span)
			t.Cost += billing.Amount(share(int64(e.Cost), cur, span) - share(int64(e.Cost), prev, span))
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read ledger: %w", err)
	}

	// 2. Who held which card when.
	held := map[card][]heldCard{}
	err = rs.Store.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(BucketAllocHistory, "", fmt.Sprintf("%013d", p.To.UnixMilli()), func(_ string, raw []byte) error {
			var a broker.AllocRecord
			if err := json.Unmarshal(raw, &a); err != nil {
				return fmt.Errorf("decode allocation: %w", err)
			}
			if (!a.End.IsZero() && !a.End.After(p.From)) || len(a.GPUs) == 0 {
				return nil
			}
			per := a.GPUMilli / int64(len(a.GPUs))
			for _, g := range a.GPUs {
				k := card{a.Pool.Node, g}
				held[k] = append(held[k], heldCard{job: a.Job, team: a.Team, pool: a.Pool.Label(), model: a.GPUModel,
					start: a.Start, end: a.End, milli: per})
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read allocations: %w", err)
	}

	// 3. Memory and idleness: the telemetry, card by card, attributed.
	width := res.Width()
	holders := map[string]*idleHolder{}
	cards := map[card]*idleCard{}
	err = rs.Store.View(ctx, func(tx broker.Tx) error {
		return broker.ScanTelemetry(tx, res, p.From.Add(-width+time.Second), p.To, "", func(pt broker.TelemetryPoint) error {
			a, b := maxT(pt.Start, p.From), minT(pt.Start.Add(width), p.To, now)
			if !a.Before(b) {
				return nil
			}
			k := card{pt.Node, pt.GPU}
			mid := pt.Start.Add(width / 2)
			var on []heldCard
			var total int64
			for _, h := range held[k] {
				if !mid.Before(h.start) && (h.end.IsZero() || mid.Before(h.end)) {
					on = append(on, h)
					total += h.milli
				}
			}
			secs := b.Sub(a).Seconds()
			idle := pt.SMUtil < float64(threshold)
			card := cards[k]
			if card == nil {
				card = &idleCard{IdleCard: api.IdleCard{Node: pt.Node, GPU: pt.GPU}}
				cards[k] = card
			}
			if idle {
				card.IdleSeconds += secs
				if len(on) > 0 {
					card.HeldIdleSeconds += secs
					card.LastHolder = on[0].job
				}
				if !card.runEnd.Equal(a) {
					card.runStart = a
				}
				card.runEnd = b
				if run := b.Sub(card.runStart).Seconds(); run > card.LongestIdleSeconds {
					card.LongestIdleSeconds, card.LongestIdleEnd = run, b
				}
			}
			for _, h := range on {
				f := float64(h.milli) / float64(total)
				shiftPieces(r, a, b, func(shift string, x, y time.Time) {
					if team != "" && h.team != team {
						return
					}
					t := row(rowKey{h.team, h.pool, h.model, shift})
					d := y.Sub(x).Seconds() * f
					t.MemoryByteSeconds += float64(pt.MemoryUsedBytes) * d
					t.CardSeconds += d
				})
				if idle && pt.MemoryUsedBytes >= idleMemoryFloor && (team == "" || h.team == team) {
					ih := holders[h.job]
					if ih == nil {
						ih = &idleHolder{IdleHolder: api.IdleHolder{Job: h.job, Team: h.team, First: a}}
						holders[h.job] = ih
					}
					ih.IdleCardSeconds += secs * f
					ih.memSeconds += float64(pt.MemoryUsedBytes) * secs * f
					ih.Last = b
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read telemetry: %w", err)
	}

	keys := make([]rowKey, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b rowKey) int {
		return strings.Compare(a.team+"\x00"+a.pool+"\x00"+a.model+"\x00"+a.shift, b.team+"\x00"+b.pool+"\x00"+b.model+"\x00"+b.shift)
	})
	for _, k := range keys {
		t := rows[k]
		rep.Total.Add(*t)
		t.Derive()
		rep.Rows = append(rep.Rows, api.UtilRow{Team: k.team, Pool: k.pool, GPUModel: k.model, Shift: k.shift, UtilTotals: *t})
	}
	rep.Total.Derive()
	for _, ih := range holders {
		if ih.IdleCardSeconds > 0 {
			ih.MeanMemoryBytes = int64(ih.memSeconds / ih.IdleCardSeconds)
		}
		rep.IdleHolders = append(rep.IdleHolders, ih.IdleHolder)
	}
	slices.SortFunc(rep.IdleHolders, func(a, b api.IdleHolder) int {
		return cmpDesc(a.IdleCardSeconds*float64(a.MeanMemoryBytes), b.IdleCardSeconds*float64(b.MeanMemoryBytes), a.Job, b.Job)
	})
	rep.IdleHolders = rep.IdleHolders[:min(len(rep.IdleHolders), reportListLimit)]
	if team == "" {
		for _, c := range cards {
			if c.IdleSeconds > 0 {
				rep.IdleCards = append(rep.IdleCards, c.IdleCard)
			}
		}
	}
	slices.SortFunc(rep.IdleCards, func(a, b api.IdleCard) int {
		return cmpDesc(a.IdleSeconds, b.IdleSeconds, fmt.Sprintf("%s/%03d", a.Node, a.GPU), fmt.Sprintf("%s/%03d", b.Node, b.GPU))
	})
	rep.IdleCards = rep.IdleCards[:min(len(rep.IdleCards), reportListLimit)]
	rs.Source.Read(func(v View) { rep.DataWaits = dataWaits(v, p, team) })
	return rep, nil
}

func cmpDesc(a, b float64, ta, tb string) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return strings.Compare(ta, tb)
}

func maxT(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minT(ts ...time.Time) time.Time {
	m := ts[0]
	for _, t := range ts[1:] {
		if t.Before(m) {
			m = t
		}
	}
	return m
}

// WriteUtilizationCSV writes one of the report's tables as CSV: "rows"
// (or ""), "jobs" (the idle holders) or "cards" (the idle cards).
func WriteUtilizationCSV(w io.Writer, rep *api.UtilizationReport, table string) error {
	cw := csv.NewWriter(w)
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	gib := func(b float64) string { return f(b/(1<<30), 3) }
	switch table {
	case "jobs":
		_ = cw.Write([]string{"job", "team", "idle_card_hours", "mean_memory_gib", "first", "last"})
		for _, h := range rep.IdleHolders {
			_ = cw.Write([]string{h.Job, h.Team, f(h.IdleCardSeconds/3600, 3), gib(float64(h.MeanMemoryBytes)),
				h.First.UTC().Format(time.RFC3339), h.Last.UTC().Format(time.RFC3339)})
		}
	case "cards":
		_ = cw.Write([]string{"node", "gpu", "idle_hours", "held_idle_hours", "longest_idle_hours", "longest_idle_end", "last_holder"})
		for _, c := range rep.IdleCards {
			_ = cw.Write([]string{c.Node, strconv.Itoa(c.GPU), f(c.IdleSeconds/3600, 3), f(c.HeldIdleSeconds/3600, 3),
				f(c.LongestIdleSeconds/3600, 3), c.LongestIdleEnd.UTC().Format(time.RFC3339), c.LastHolder})
		}
	default:
		_ = cw.Write([]string{"team", "pool", "gpu_model", "shift", "gpu_hours_allocated", "gpu_hours_computing", "compute_utilization",
			"overhead_gpu_hours", "memory_gib_hours", "mean_memory_gib", "cost", "currency"})
		line := func(team, pool, model, shift string, t api.UtilTotals) {
			_ = cw.Write([]string{team, pool, model, shift, t.GPUHours, t.ComputingGPUHours, f(t.Utilization, 4),
				billing.FormatGPUHours(t.OverheadGPUMillis), f(t.MemoryGiBHours, 3), gib(float64(t.MeanMemoryBytes)), t.Cost.String(), rep.Currency})
		}
		for _, r := range rep.Rows {
			line(r.Team, r.Pool, r.GPUModel, r.Shift, r.UtilTotals)
		}
		line("TOTAL", "", "", "", rep.Total)
	}
	cw.Flush()
	return cw.Error()
}
