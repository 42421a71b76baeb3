package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/report"
)

// The allocation history the utilisation report reads (broker/report):
// every commit that gives or takes back GPUs copies its allocation records
// into report.BucketAllocHistory, in the same transaction.

// allocHistoryPrune bounds the stale records one commit deletes.
const allocHistoryPrune = 50

func allocHistoryKey(a broker.AllocRecord) string {
	return fmt.Sprintf("%013d/%s/%06d/%s", a.Start.UnixMilli(), a.Job, a.Attempt, a.Pool.Node)
}

// keepAllocHistoryLocked copies the allocation records a job change wrote
// (GPUs given, or taken back) into report.BucketAllocHistory, in the same
// transaction; and deletes a few records older than any report can use.
func (s *Server) keepAllocHistoryLocked(tx broker.Tx, old, j *broker.Job, now time.Time) error {
	enter := j.State.Holding() && (old == nil || !old.State.Holding() || old.Attempt != j.Attempt)
	leave := old != nil && old.State.Holding() && (!j.State.Holding() || old.Attempt != j.Attempt)
	var copies []broker.Placement
	if enter {
		copies = append(copies, j.Placements...)
	}
	if leave {
		for _, p := range old.Placements {
			if err := copyAlloc(tx, old.ID, old.Attempt, p.Node); err != nil {
				return err
			}
		}
	}
	for _, p := range copies {
		if err := copyAlloc(tx, j.ID, j.Attempt, p.Node); err != nil {
			return err
		}
	}
	if !enter {
		return nil
	}
	keep := s.cfg().Telemetry.HourRetention.D()
	for _, q := range s.cfg().Queues {
		keep = max(keep, s.cfg().Telemetry.HourRetention.D()+q.MaxTimeout.D())
	}
	var stale []string
	err := tx.Scan(report.BucketAllocHistory, "", fmt.Sprintf("%013d", now.Add(-keep).UnixMilli()), func(k string, _ []byte) error {
		stale = append(stale, k)
		if len(stale) == allocHistoryPrune {
			return broker.ErrStopScan
		}
		return nil
	})
	if err != nil && !errors.Is(err, broker.ErrStopScan) {
		return err
	}
	for _, k := range stale {
		if err := tx.Delete(report.BucketAllocHistory, k); err != nil {
			return err
		}
	}
	return nil
}

func copyAlloc(tx broker.Tx, job string, attempt int, node string) error {
	a, err := broker.GetAlloc(tx, job, attempt, node)
	if errors.Is(err, broker.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	raw, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return tx.Put(report.BucketAllocHistory, allocHistoryKey(a), raw)
}
