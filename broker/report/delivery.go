package report

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
)

// The delivery report: how long jobs wait, how long they take, how many
// succeed, how often they are preempted and resume, who starves, and what
// a unit of output costs. The broker's delivery metrics count the same
// events as they happen (EnteredQueue, Resumed).

// BucketUnits holds the units of output jobs reported: "t/<ulid>" → one
// UnitsReport (ULIDs sort by time, so a period is one range scan), and
// "id/<job>/<id>" → the key of a report sent with an idempotency id.
const BucketUnits broker.Bucket = "units"

// EnteredQueue is when the job last entered pending before the end of h.
func EnteredQueue(h []broker.Transition) (time.Time, bool) {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].To == broker.StatePending {
			return h[i].At, true
		}
	}
	return time.Time{}, false
}

// Resumed reports whether the attempt starting after h follows a
// preemption: the last attempt before it was preempted.
func Resumed(h []broker.Transition) bool {
	for i := len(h) - 1; i >= 0; i-- {
		switch h[i].To {
		case broker.StatePreempted:
			return true
		case broker.StateStarting:
			return false
		}
	}
	return false
}

// ulidBound is the smallest ULID of an instant: a key bound for ranges of
// job ids and units reports.
func ulidBound(t time.Time) string {
	if t.Before(time.UnixMilli(0)) {
		return ""
	}
	var id ulid.ULID
	_ = id.SetTime(ulid.Timestamp(t))
	return id.String()
}

// --- the delivery report ----------------------------------------------------

func summarise(ds []time.Duration) api.Durations {
	if len(ds) == 0 {
		return api.Durations{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	rank := func(p float64) float64 {
		i := int(p*float64(len(ds))+0.999999) - 1 // nearest rank
		return ds[min(max(i, 0), len(ds)-1)].Seconds()
	}
	return api.Durations{Count: len(ds), Mean: (sum / time.Duration(len(ds))).Seconds(), P50: rank(0.5), P90: rank(0.9), P99: rank(0.99), Max: ds[len(ds)-1].Seconds()}
}

// Delivery builds the delivery report of a period, of one team or all
// when team is empty: it reads the job records submitted from
// reports.lookback before the period to its end, and the units and ledger
// of the period, from the store; the jobs starving now from the view.
func (rs *Reports) Delivery(ctx context.Context, p billing.Period, team string) (*api.DeliveryReport, error) {
	now := rs.Clock.Now()
	bound := rs.Config.Reports.StarvationAfter.D()
	rep := &api.DeliveryReport{Period: p, Team: team, StarvationAfter: broker.FormatDuration(bound), Rows: []api.DeliveryRow{}, Starving: []api.StarvingJob{}, Units: []api.UnitCost{}}
	rows := map[[2]string]*deliveryRow{}
	row := func(j *broker.Job) *deliveryRow {
		k := [2]string{j.Spec.Queue, j.Spec.Priority}
		r := rows[k]
		if r == nil {
			r = &deliveryRow{DeliveryRow: api.DeliveryRow{Queue: k[0], Priority: k[1]}}
			rows[k] = r
		}
		return r
	}
	in := p.Contains
	err := rs.Store.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(broker.BucketJobs, ulidBound(p.From.Add(-rs.Config.Reports.Lookback.D())), ulidBound(p.To), func(_ string, raw []byte) error {
			var j broker.Job
			if err := json.Unmarshal(raw, &j); err != nil {
				return fmt.Errorf("decode job: %w", err)
			}
			if team != "" && j.Spec.Team != team {
				return nil
			}
			r := row(&j)
			var waitFrom time.Time
			waiting := false
			for i, t := range j.History {
				if waiting && t.To != broker.StatePending {
					// A wait ended (started, cancelled, …): did it starve in the period?
					if cross := waitFrom.Add(bound); t.At.After(cross) && in(cross) {
						r.Starved++
					}
					waiting = false
				}
				switch {
				case t.To == broker.StatePending:
					if !waiting {
						waitFrom, waiting = t.At, true
					}
				case t.To == broker.StateStarting && in(t.At):
					if w, ok := EnteredQueue(j.History[:i]); ok {
						r.waits = append(r.waits, t.At.Sub(w))
					}
					if Resumed(j.History[:i]) {
						r.Resumes++
					}
				case t.To == broker.StatePreempted && in(t.At):
					r.Preemptions++
				case t.To.Terminal() && in(t.At):
					r.completions = append(r.completions, t.At.Sub(j.SubmittedAt))
					switch t.To {
					case broker.StateSucceeded:
						r.Succeeded++
					case broker.StateFailed:
						r.Failed++
					case broker.StateTimedOut:
						r.TimedOut++
					case broker.StateCancelled:
						r.Cancelled++
					}
				}
			}
			if waiting {
				end := minT(now, p.To)
				if cross := waitFrom.Add(bound); end.After(cross) && in(cross) {
					r.Starved++
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	var all, allDone []time.Duration
	for _, k := range sortedRowKeys(rows) {
		r := rows[k]
		if len(r.waits)+len(r.completions)+r.Preemptions+r.Starved == 0 {
			continue
		}
		finish(r)
		all = append(all, r.waits...)
		allDone = append(allDone, r.completions...)
		t := &rep.Total
		t.Succeeded += r.Succeeded
		t.Failed += r.Failed
		t.TimedOut += r.TimedOut
		t.Cancelled += r.Cancelled
		t.Preemptions += r.Preemptions
		t.Resumes += r.Resumes
		t.Starved += r.Starved
		rep.Rows = append(rep.Rows, r.DeliveryRow)
	}
	total := deliveryRow{DeliveryRow: rep.Total, waits: all, completions: allDone}
	finish(&total)
	rep.Total = total.DeliveryRow

	rs.Source.Read(func(v View) { rep.Starving = starving(v, now, bound, team) })

	units, cur, err := unitCosts(ctx, rs.Store, p, team)
	if err != nil {
		return nil, err
	}
	rep.Units, rep.Currency = units, cur
	return rep, nil
}

// starving lists the pending jobs (of one team, or all) that have waited
// longer than bound since they last entered the queue, longest first.
func starving(v View, now time.Time, bound time.Duration, team string) []api.StarvingJob {
	out := []api.StarvingJob{}
	for j := range v.Jobs() {
		if j.State != broker.StatePending || (team != "" && j.Spec.Team != team) {
			continue
		}
		since, ok := EnteredQueue(j.History)
		if !ok || now.Sub(since) <= bound {
			continue
		}
		r, _ := v.Reason(j.ID)
		out = append(out, api.StarvingJob{ID: j.ID, Team: j.Spec.Team, Queue: j.Spec.Queue, Priority: j.Spec.Priority,
			Since: since, Reason: r.Message()})
	}
	slices.SortFunc(out, func(a, b api.StarvingJob) int { return a.Since.Compare(b.Since) })
	return out
}

// deliveryRow is a row of the delivery report while it is summed: the
// waits and completion times its summaries come from.
type deliveryRow struct {
	api.DeliveryRow
	waits, completions []time.Duration
}

func finish(r *deliveryRow) {
	r.Wait = summarise(r.waits)
	r.Completion = summarise(r.completions)
	if n := r.Succeeded + r.Failed + r.TimedOut; n > 0 {
		r.SuccessRate = float64(r.Succeeded) / float64(n)
	}
}

func sortedRowKeys(m map[[2]string]*deliveryRow) [][2]string {
	keys := make([][2]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, k int) bool {
		if keys[i][0] != keys[k][0] {
			return keys[i][0] < keys[k][0]
		}
		return keys[i][1] < keys[k][1]
	})
	return keys
}

// unitCosts sums the period's units by team and kind, and the ledger's
// GPU-time and cost of the jobs that reported them.
func unitCosts(ctx context.Context, store broker.Store, p billing.Period, team string) ([]api.UnitCost, string, error) {
	type key struct{ team, kind string }
	sums := map[key]*api.UnitCost{}
	jobsOf := map[key]map[string]bool{}
	want := map[string]bool{}
	err := store.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(BucketUnits, "t/"+ulidBound(p.From), "t/"+ulidBound(p.To), func(_ string, raw []byte) error {
			var u api.UnitsReport
			if err := json.Unmarshal(raw, &u); err != nil {
				return fmt.Errorf("decode units report: %w", err)
			}
			if (team != "" && u.Team != team) || !p.Contains(u.At) {
				return nil
			}
			k := key{u.Team, u.Kind}
			if sums[k] == nil {
				sums[k] = &api.UnitCost{Team: u.Team, Kind: u.Kind}
				jobsOf[k] = map[string]bool{}
			}
			sums[k].Units += u.Units
			jobsOf[k][u.Job] = true
			want[u.Job] = true
			return nil
		})
	})
	if err != nil || len(sums) == 0 {
		return []api.UnitCost{}, "", err
	}
	type spend struct {
		ms   int64
		cost billing.Amount
	}
	byJob := map[string]*spend{}
	cur := ""
	err = broker.Ledger{Store: store}.Scan(ctx, p.From, p.To, func(e billing.Entry) error {
		if !want[e.Job] {
			return nil
		}
		cur = e.Currency
		sp := byJob[e.Job]
		if sp == nil {
			sp = &spend{}
			byJob[e.Job] = sp
		}
		sp.ms += e.GPUMillis
		sp.cost += e.Cost
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("read ledger: %w", err)
	}
	out := make([]api.UnitCost, 0, len(sums))
	for k, uc := range sums {
		for job := range jobsOf[k] {
			uc.Jobs++
			if sp := byJob[job]; sp != nil {
				uc.GPUMillis += sp.ms
				uc.Cost += sp.cost
			}
		}
		uc.CostPer1000 = uc.Cost.MulDiv(1000, uc.Units)
		uc.GPUSecondsPer1000 = float64(uc.GPUMillis) / float64(uc.Units)
		out = append(out, *uc)
	}
	slices.SortFunc(out, func(a, b api.UnitCost) int {
		if c := strings.Compare(a.Team, b.Team); c != 0 {
			return c
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return out, cur, nil
}
