package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// gpuKey names one card.
type gpuKey struct {
	node string
	gpu  int
}

// accum gathers one card's samples within one minute.
type accum struct {
	uuid    string
	start   time.Time
	memSum  int64
	memMax  int64
	utilSum int64
	utilMax int
	n       int
}

func (a *accum) point(k gpuKey) broker.TelemetryPoint {
	return broker.TelemetryPoint{Node: k.node, GPU: k.gpu, UUID: a.uuid, Start: a.start,
		MemoryUsedBytes: a.memSum / int64(a.n), MemoryMaxBytes: a.memMax,
		SMUtil: float64(a.utilSum) / float64(a.n), SMUtilMax: a.utilMax, Samples: a.n}
}

// telemetryState is the leader's running aggregation of agent samples.
type telemetryState struct {
	open   map[gpuKey]*accum
	closed []broker.TelemetryPoint
	// lastPrune is when old points were last deleted.
	lastPrune time.Time
	// rolledUpTo is the end of the last hour this broker knows to be
	// rolled up in the store (zero: read the store's mark). The mark only
	// moves forward, so while now's hour is not past it a cycle has
	// nothing to roll up and need not read the mark.
	rolledUpTo time.Time
}

const metaRolledUp = "telemetry/rolled-up-to" // the end of the last hour rolled up

// recordTelemetryLocked keeps the node's latest sample for views, adds it
// to the minute points, and tracks which jobs' cards have gone quiet.
func (s *Server) recordTelemetryLocked(node string, sample *gpu.Sample, owners map[int]string) {
	s.telemetry[node] = sample
	s.owners[node] = owners
	now := s.clock.Now()
	minute := now.Truncate(time.Minute)
	util := map[int]int{}
	for _, d := range sample.Devices {
		k := gpuKey{node, d.Index}
		a := s.tele.open[k]
		if a == nil || !a.start.Equal(minute) {
			if a != nil && a.n > 0 {
				s.tele.closed = append(s.tele.closed, a.point(k))
			}
			a = &accum{uuid: d.UUID, start: minute}
			s.tele.open[k] = a
		}
		a.n++
		a.memSum += d.MemoryUsedBytes
		a.memMax = max(a.memMax, d.MemoryUsedBytes)
		a.utilSum += int64(d.SMUtil)
		a.utilMax = max(a.utilMax, d.SMUtil)
		util[d.Index] = d.SMUtil
	}
	threshold := s.cfg().Idle.Threshold
	for _, j := range s.view.HoldingOn(node) {
		if j.State != broker.StateRunning {
			continue
		}
		p, _, _ := placedOn(j, node)
		busy := false
		for _, g := range p.GPUs {
			if u, ok := util[g]; !ok || u >= threshold {
				busy = true
			}
		}
		switch _, quiet := s.quiet[j.ID]; {
		case busy:
			delete(s.quiet, j.ID)
		case !quiet:
			s.quiet[j.ID] = now
		}
	}
}

// flushTelemetryLocked writes the minutes that have closed.
func (s *Server) flushTelemetryLocked(ctx context.Context, now time.Time) error {
	minute := now.Truncate(time.Minute)
	for k, a := range s.tele.open {
		if a.start.Before(minute) {
			s.tele.closed = append(s.tele.closed, a.point(k))
			delete(s.tele.open, k)
		}
	}
	if len(s.tele.closed) > 0 {
		pts := s.tele.closed
		if err := s.store.Update(ctx, func(tx broker.Tx) error { return broker.PutTelemetry(tx, broker.Minute, pts) }); err != nil {
			return fmt.Errorf("write telemetry: %w", err)
		}
		s.tele.closed = nil
	}
	return nil
}

// telemetryUpkeep is what a cycle does with stored telemetry after it
// released the lock: roll closed hours up, and now and then prune.
type telemetryUpkeep struct {
	rollUp, prune bool
}

// telemetryUpkeepLocked says whether this cycle rolls hours up (only
// when every closed minute is stored, so that an hour is rolled up once,
// and an hour has ended since the last roll-up this broker knows of) and
// whether it prunes (every 10 minutes).
func (s *Server) telemetryUpkeepLocked(now time.Time) telemetryUpkeep {
	if len(s.tele.closed) > 0 {
		return telemetryUpkeep{}
	}
	u := telemetryUpkeep{rollUp: s.tele.rolledUpTo.Before(now.Truncate(time.Hour))}
	if now.Sub(s.tele.lastPrune) >= 10*time.Minute {
		s.tele.lastPrune = now
		u.prune = true
	}
	return u
}

// upkeepTelemetry rolls closed hours up from the stored minutes and
// deletes points past retention. It reads and writes the store only, so
// it runs without the broker's lock: at 10,000 cards an hour is 600,000
// minute points to read.
func (s *Server) upkeepTelemetry(ctx context.Context, now time.Time, u telemetryUpkeep) error {
	if u.rollUp {
		upTo, err := s.rollUpHours(ctx, now)
		if err != nil {
			return err
		}
		// Noted under the lock; a term that began meanwhile may keep it:
		// the store's mark is at least upTo whoever leads.
		s.lock()
		if s.tele.rolledUpTo.Before(upTo) {
			s.tele.rolledUpTo = upTo
		}
		s.mu.Unlock()
	}
	if !u.prune {
		return nil
	}
	if _, err := broker.PruneTelemetry(ctx, s.store, broker.Minute, now.Add(-s.cfg().Telemetry.MinuteRetention.D()), 20000); err != nil {
		return err
	}
	_, err := broker.PruneTelemetry(ctx, s.store, broker.Hour, now.Add(-s.cfg().Telemetry.HourRetention.D()), 20000)
	return err
}

// rollUpHours turns the minute points of every hour that ended since
// the last roll-up into hourly points, and returns the end of the last
// hour now rolled up. It reads the stored minutes, so a leader change
// loses nothing.
func (s *Server) rollUpHours(ctx context.Context, now time.Time) (time.Time, error) {
	hour := now.Truncate(time.Hour)
	var upTo time.Time
	err := s.store.View(ctx, func(tx broker.Tx) error {
		raw, err := tx.Get(broker.BucketMeta, metaRolledUp)
		if errors.Is(err, broker.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		sec, err := strconv.ParseInt(string(raw), 10, 64)
		upTo = time.Unix(sec, 0).UTC()
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	if upTo.IsZero() {
		upTo = hour.Add(-time.Hour) // first start: the previous hour at most
	}
	for h := upTo; h.Before(hour); h = h.Add(time.Hour) {
		// The hour's minutes are read in a View: they are written no more
		// once the hour has ended, and on Redis an Update that read
		// (watched) each of them would commit in time quadratic in their
		// number (a minute point per card).
		sums := map[gpuKey]*accum{}
		err := s.store.View(ctx, func(tx broker.Tx) error {
			return broker.ScanTelemetry(tx, broker.Minute, h, h.Add(time.Hour), "", func(p broker.TelemetryPoint) error {
				k := gpuKey{p.Node, p.GPU}
				a := sums[k]
				if a == nil {
					a = &accum{uuid: p.UUID, start: h}
					sums[k] = a
				}
				// Weight each minute by its samples so the hour's mean is
				// the mean of all samples.
				a.n += p.Samples
				a.memSum += p.MemoryUsedBytes * int64(p.Samples)
				a.memMax = max(a.memMax, p.MemoryMaxBytes)
				a.utilSum += int64(p.SMUtil*float64(p.Samples) + 0.5)
				a.utilMax = max(a.utilMax, p.SMUtilMax)
				return nil
			})
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("roll up telemetry hour %s: %w", h.Format(time.RFC3339), err)
		}
		pts := make([]broker.TelemetryPoint, 0, len(sums))
		for k, a := range sums {
			if a.n > 0 {
				pts = append(pts, a.point(k))
			}
		}
		err = s.store.Update(ctx, func(tx broker.Tx) error {
			if err := broker.PutTelemetry(tx, broker.Hour, pts); err != nil {
				return err
			}
			return tx.Put(broker.BucketMeta, metaRolledUp, []byte(strconv.FormatInt(h.Add(time.Hour).Unix(), 10)))
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("roll up telemetry hour %s: %w", h.Format(time.RFC3339), err)
		}
	}
	if upTo.After(hour) {
		return upTo, nil // another leader's clock is ahead of this one's
	}
	return hour, nil
}

// checkIdleLocked marks jobs whose cards have been quiet for the idle
// window, and ends them where the queue's policy says so.
//
// It looks only at the jobs holding cards (the view's index by node), not
// at every job: with 100,000 waiting it would otherwise walk them all, under
// the lock, every cycle.
func (s *Server) checkIdleLocked(ctx context.Context, now time.Time) error {
	window := s.cfg().Idle.Window.D()
	running := map[string]*broker.Job{}
	for _, j := range s.view.Held() {
		if j.State == broker.StateRunning {
			running[j.ID] = j // a job on several nodes comes once a node
		}
	}
	for id := range s.quiet {
		if running[id] == nil {
			delete(s.quiet, id) // no longer running, or ended
		}
	}
	var changed []*broker.Job
	for _, id := range slices.Sorted(maps.Keys(running)) {
		j := running[id]
		since, quiet := s.quiet[id]
		switch {
		case quiet && j.IdleSince == nil && now.Sub(since) >= window:
			jj := cloneJob(j)
			t := since
			jj.IdleSince = &t
			detail := fmt.Sprintf("its GPUs computed under %d%% since %s", s.cfg().Idle.Threshold, since.UTC().Format(time.RFC3339))
			if s.cfg().ReclaimsIdle(j.Spec.Queue) && jj.Stop == nil {
				jj.Stop = &broker.StopRequest{Reason: "idle_reclaimed", Detail: detail, Signal: jj.Spec.Checkpoint.Signal,
					Grace: jj.Spec.Checkpoint.Grace.D(), RequestedAt: now, By: "idle policy"}
				s.log.Warn("reclaiming idle job", "job", id, "team", j.Spec.Team, "idle_since", since)
			} else {
				s.log.Warn("job holds GPUs without computing", "job", id, "team", j.Spec.Team, "idle_since", since)
			}
			s.metrics.idle.WithLabelValues(j.Spec.Queue).Inc()
			changed = append(changed, jj)
		case !quiet && j.IdleSince != nil:
			jj := cloneJob(j)
			jj.IdleSince = nil
			changed = append(changed, jj)
		}
	}
	if err := s.commitLocked(ctx, changed, nil, nil); err != nil {
		return err
	}
	for _, j := range changed {
		if j.Stop != nil {
			for _, n := range j.Nodes() {
				s.wakeNodeLocked(n)
			}
		}
	}
	return nil
}

const maxTelemetryPoints = 50_000

// getTelemetry serves stored points: ?from=&to= (RFC 3339, default the last
// hour), ?resolution=m|h, ?node=.
func (s *Server) getTelemetry(c echo.Context) error {
	now := s.clock.Now()
	to, err := timeParam(c, "to", now)
	if err != nil {
		return err
	}
	from, err := timeParam(c, "from", to.Add(-time.Hour))
	if err != nil {
		return err
	}
	if !from.Before(to) {
		return errBadRequest("from", broker.CodeOutOfRange, "must be before to")
	}
	res := broker.Resolution(c.QueryParam("resolution"))
	switch res {
	case "":
		res = broker.Minute
	case broker.Minute, broker.Hour:
	default:
		return errBadRequest("resolution", broker.CodeInvalid, "must be m (minute) or h (hour)")
	}
	page := api.TelemetryPage{Resolution: res, Points: []broker.TelemetryPoint{}}
	err = s.store.View(c.Request().Context(), func(tx broker.Tx) error {
		return broker.ScanTelemetry(tx, res, from, to, c.QueryParam("node"), func(p broker.TelemetryPoint) error {
			if len(page.Points) == maxTelemetryPoints {
				page.Truncated = true
				return broker.ErrStopScan
			}
			page.Points = append(page.Points, p)
			return nil
		})
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func timeParam(c echo.Context, name string, def time.Time) (time.Time, error) {
	v := c.QueryParam(name)
	if v == "" {
		return def, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		if d, derr := time.Parse(time.DateOnly, v); derr == nil {
			return d, nil
		}
		return time.Time{}, errBadRequest(name, broker.CodeInvalid, "must be a time like 2026-11-30T14:00:00Z or a date like 2026-11-30")
	}
	return t, nil
}
