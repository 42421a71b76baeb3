package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/billing/s3sink"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// meterEvery is how often the leader meters: every slice, at most every
// 10 s. The meter writes only whole slices, so metering more often than a
// slice would only move less at a time.
func (s *Server) meterEvery() time.Duration {
	slice := s.cfg().BillingCompiled().Meter.Slice
	if slice == 0 {
		slice = billing.DefaultSlice
	}
	return min(10*time.Second, slice)
}

// meterState is the leader's metering bookkeeping.
type meterState struct {
	last time.Time
	// reported holds problems already logged, so each is logged once.
	reported map[string]bool
}

func ms(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// allocChangesLocked keeps the allocation records in step with a job's
// change, inside the transaction that writes the job: GPUs given (a new
// record from now) or taken back (its end). The end is now, except for a
// node lost, whose jobs held their GPUs until its last heartbeat.
func (s *Server) allocChangesLocked(tx broker.Tx, old, j *broker.Job, now time.Time) error {
	enter := j.State.Holding() && (old == nil || !old.State.Holding() || old.Attempt != j.Attempt)
	leave := old != nil && old.State.Holding() && (!j.State.Holding() || old.Attempt != j.Attempt)
	if leave {
		end := now
		for _, t := range j.History[min(len(old.History), len(j.History)):] {
			if t.From.Holding() {
				if t.Reason == "node_lost" {
					end = t.At
				}
				break
			}
		}
		for _, p := range old.Placements {
			a, err := broker.GetAlloc(tx, old.ID, old.Attempt, p.Node)
			if errors.Is(err, broker.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if a.End.IsZero() {
				a.End = ms(end)
				if a.End.Before(a.Start) {
					a.End = a.Start
				}
				if sp := stagingSpans(j.Data, old.Attempt); sp != nil {
					a.Staging = sp
				} else {
					a.Staging = stagingSpans(old.Data, old.Attempt)
				}
				if err := broker.PutAlloc(tx, a); err != nil {
					return err
				}
			}
		}
	}
	if enter {
		for _, p := range j.Placements {
			if err := broker.PutAlloc(tx, s.allocRecord(j, p, now)); err != nil {
				return err
			}
		}
	}
	return nil
}

// allocRecord describes one placement for the meter.
func (s *Server) allocRecord(j *broker.Job, p broker.Placement, now time.Time) broker.AllocRecord {
	n := s.view.Node(p.Node)
	pool := billing.Pool{Kind: billing.PoolOnPrem, Node: p.Node}
	model := ""
	var cardMem int64
	if n != nil {
		pool.Name = n.Pool
		if len(n.Inventory.Devices) > 0 {
			model = gpu.ShortModel(n.Inventory.Devices[0].Model)
			cardMem = n.Inventory.Devices[0].MemoryBytes
		}
		if r := s.fleet.RecordLocked(n.Instance); r != nil && n.Instance != "" {
			pool.Kind = s.fleet.PoolKind(r)
			pool.InstanceID = r.ID
			pool.Provider = r.Provider
			pool.Region = r.Offer.Region
			pool.InstanceType = r.Offer.InstanceType
		}
	}
	per := int64(1000)
	if p.MemoryShare > 0 {
		per = billing.ShareMilli(p.MemoryShare, cardMem)
	}
	return broker.AllocRecord{
		Allocation: billing.Allocation{
			Job: j.ID, Attempt: j.Attempt, Team: j.Spec.Team, Project: j.Spec.Project, User: j.User, Queue: j.Spec.Queue,
			Pool: pool, GPUModel: model, GPUMilli: per * int64(len(p.GPUs)), Start: ms(now),
		},
		GPUs: p.GPUs,
	}
}

// meterLocked runs one metering cycle over the allocation records and
// drops the records the ledger has finished.
func (s *Server) meterLocked(ctx context.Context, now time.Time) error {
	ledger := broker.Ledger{Store: s.store, Budgets: s.billingZone()}
	var recs []broker.AllocRecord
	if err := s.store.View(ctx, func(tx broker.Tx) error {
		var err error
		recs, err = broker.ListAllocs(tx)
		return err
	}); err != nil {
		return err
	}
	cursor, err := ledger.Watermark(ctx, billing.MeterMark)
	if err != nil {
		return err
	}
	machines := s.fleet.MeterMachinesLocked(cursor)
	if len(recs) == 0 && len(machines) == 0 {
		return nil
	}
	util, err := s.utilSamplesLocked(ctx, cursor, now)
	if err != nil {
		return err
	}
	allocs := make([]billing.Allocation, 0, len(recs))
	for _, r := range recs {
		a := r.Allocation
		a.Util = utilFor(util, r)
		if j := s.view.Job(r.Job); a.End.IsZero() && j != nil {
			a.Staging = stagingSpans(j.Data, r.Attempt)
		}
		allocs = append(allocs, a)
	}
	allocs = append(allocs, s.slurm.AllocsLocked(cursor)...)
	comp := s.cfg().BillingCompiled()
	res, err := billing.MeterCycle(ctx, ledger, ledger, comp.Meter, allocs, machines, ms(now))
	for _, p := range res.Problems {
		if !s.meter.reported[p.Error()] {
			s.meter.reported[p.Error()] = true
			s.log.Warn("metering problem", "err", p)
		}
	}
	if err != nil {
		return fmt.Errorf("meter: %w", err)
	}
	var done []broker.AllocRecord
	for _, r := range recs {
		if !r.End.IsZero() && !r.End.After(res.Through) {
			done = append(done, r)
		}
	}
	if len(done) == 0 {
		return nil
	}
	return s.store.Update(ctx, func(tx broker.Tx) error {
		for _, r := range done {
			if err := broker.DeleteAlloc(tx, r); err != nil {
				return err
			}
		}
		return nil
	})
}

// utilSamplesLocked gathers each card's mean compute utilisation per
// minute since shortly before the meter's cursor: stored minute points,
// then the minute still being gathered.
func (s *Server) utilSamplesLocked(ctx context.Context, cursor, now time.Time) (map[gpuKey][]billing.UtilSample, error) {
	from := cursor.Add(-time.Minute)
	if cursor.IsZero() || now.Sub(from) > 2*time.Hour {
		from = now.Add(-2 * time.Hour)
	}
	out := map[gpuKey][]billing.UtilSample{}
	err := s.store.View(ctx, func(tx broker.Tx) error {
		return broker.ScanTelemetry(tx, broker.Minute, from.Truncate(time.Minute), now, "", func(p broker.TelemetryPoint) error {
			k := gpuKey{p.Node, p.GPU}
			out[k] = append(out[k], billing.UtilSample{At: ms(p.Start), Permille: int32(p.SMUtil*10 + 0.5)})
			return nil
		})
	})
	for k, a := range s.tele.open {
		if a.n > 0 {
			out[k] = append(out[k], billing.UtilSample{At: ms(a.start), Permille: int32(a.utilSum * 10 / int64(a.n))})
		}
	}
	for _, p := range s.tele.closed {
		k := gpuKey{p.Node, p.GPU}
		out[k] = append(out[k], billing.UtilSample{At: ms(p.Start), Permille: int32(p.SMUtil*10 + 0.5)})
	}
	return out, err
}

// utilFor averages the cards of one allocation minute by minute.
func utilFor(util map[gpuKey][]billing.UtilSample, r broker.AllocRecord) []billing.UtilSample {
	sum := map[time.Time]int64{}
	cnt := map[time.Time]int64{}
	for _, g := range r.GPUs {
		for _, u := range util[gpuKey{r.Pool.Node, g}] {
			sum[u.At] += int64(u.Permille)
			cnt[u.At]++
		}
	}
	out := make([]billing.UtilSample, 0, len(sum))
	for at, v := range sum {
		out = append(out, billing.UtilSample{At: at, Permille: int32(v / cnt[at])})
	}
	sortUtil(out)
	return out
}

func sortUtil(u []billing.UtilSample) {
	for i := 1; i < len(u); i++ {
		for k := i; k > 0 && u[k].At.Before(u[k-1].At); k-- {
			u[k], u[k-1] = u[k-1], u[k]
		}
	}
}

// billingTeam is the team a caller's billing query is restricted to: a
// user's own team always; finance and operators may name one or none.
func billingTeam(c echo.Context) (string, error) {
	p := principal(c)
	team := c.QueryParam("team")
	if p.Role == config.RoleUser {
		if team != "" && team != p.Team {
			return "", errForbidden("token %s sees only team %s", p.Name, p.Team)
		}
		return p.Team, nil
	}
	return team, nil
}

// teamPeriod is what every billing and report query names: the team it
// is restricted to (billingTeam) and its period (billingPeriod).
func (s *Server) teamPeriod(c echo.Context) (string, billing.Period, error) {
	team, err := billingTeam(c)
	if err != nil {
		return "", billing.Period{}, err
	}
	period, err := s.billingPeriod(c)
	return team, period, err
}

// billingPeriod reads ?month=YYYY-MM or ?from=&to= (dates or RFC 3339).
func (s *Server) billingPeriod(c echo.Context) (billing.Period, error) {
	loc := s.cfg().BillingCompiled().TimeZone
	if m := c.QueryParam("month"); m != "" {
		p, err := billing.ParseMonth(m, loc)
		if err != nil {
			return p, errBadRequest("month", broker.CodeInvalid, "must be a month like 2026-11")
		}
		return p, nil
	}
	now := s.clock.Now()
	def := billing.MonthOf(now, loc)
	from, err := timeParam(c, "from", def.From)
	if err != nil {
		return billing.Period{}, err
	}
	to, err := timeParam(c, "to", def.To)
	if err != nil {
		return billing.Period{}, err
	}
	if !from.Before(to) {
		return billing.Period{}, errBadRequest("from", broker.CodeOutOfRange, "must be before to")
	}
	return billing.Period{From: from, To: to}, nil
}

// usage serves GET /v1/billing/usage: GPU-hours, effective GPU-hours and
// cost grouped by ?by=team,pool,….
func (s *Server) usage(c echo.Context) error {
	team, period, err := s.teamPeriod(c)
	if err != nil {
		return err
	}
	dims, err := billing.ParseDimensions(c.QueryParam("by"))
	if err != nil {
		return errBadRequest("by", broker.CodeInvalid, "%v", err)
	}
	rep, err := billing.BuildReport(c.Request().Context(), broker.Ledger{Store: s.store},
		billing.ReportQuery{Period: period, Team: team, GroupBy: dims, Location: s.cfg().BillingCompiled().TimeZone})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

// export serves GET /v1/billing/export: the ledger for a period as FOCUS
// CSV or JSON.
func (s *Server) export(c echo.Context) error {
	team, period, err := s.teamPeriod(c)
	if err != nil {
		return err
	}
	format := billing.Format(c.QueryParam("format"))
	switch format {
	case "":
		format = billing.FormatCSV
	case billing.FormatCSV, billing.FormatJSON:
	default:
		return errBadRequest("format", broker.CodeInvalid, "must be csv or json")
	}
	gran := billing.Granularity(c.QueryParam("granularity"))
	switch gran {
	case "", billing.GranularityEntry, billing.GranularityHour, billing.GranularityDay:
	default:
		return errBadRequest("granularity", broker.CodeInvalid, "must be entry, hour or day")
	}
	comp := s.cfg().BillingCompiled()
	ct := "text/csv; charset=utf-8"
	if format == billing.FormatJSON {
		ct = "application/json"
	}
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, ct)
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=spillway-%s.%s", period.Label(), format))
	w.WriteHeader(http.StatusOK)
	_, err = billing.Export(c.Request().Context(), broker.Ledger{Store: s.store}, w, billing.ExportOptions{
		Format: format, Granularity: gran, Period: period, Team: team,
		BillingAccountID: comp.BillingAccountID, BillingAccountName: comp.BillingAccountName,
	})
	return err
}

// runExports performs the scheduled exports while ctx lives: sleep until
// the next one is due, run what is due (each retried with backoff).
func (s *Server) runExports(ctx context.Context) {
	comp := s.cfg().BillingCompiled()
	if len(comp.Exports) == 0 {
		return
	}
	ledger := broker.Ledger{Store: s.store}
	r := &billing.Runner{Store: ledger, Marks: ledger, Clock: s.clock, Log: s.log.With("component", "exports"),
		Retry: comp.Retry, BillingAccountID: comp.BillingAccountID, BillingAccountName: comp.BillingAccountName}
	for _, x := range comp.Exports {
		sink, err := s3sink.SinkFor(ctx, x.Destination)
		if err != nil {
			s.log.Error("scheduled export has no usable destination", "export", x.Name, "err", err)
			continue
		}
		r.Jobs = append(r.Jobs, billing.ExportJob{ScheduledExport: x, Sink: sink})
	}
	for ctx.Err() == nil {
		for _, st := range r.RunDue(ctx) {
			s.metrics.exports.WithLabelValues(st.Export, string(st.State)).Inc()
		}
		next := r.NextRun(s.clock.Now())
		wait := time.Minute // re-check waiting exports (the meter may catch up)
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(s.clock.Now()), time.Second))
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(wait):
		}
	}
}
