package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// BucketTeamJobs indexes jobs by team: "<team>/<job id>" → "" for every
// job, kept by PutJob, so a team's listing reads that team's jobs only.
const BucketTeamJobs Bucket = "teamjobs"

// metaTeamIndex marks a store whose team index covers every job.
const metaTeamIndex = "index/teamjobs"

func teamJobKey(team, id string) string { return team + "/" + id }

// EnsureTeamIndex builds the team index of a store written before it
// existed (once; later calls find the mark and return). It reads the jobs
// a thousand at a time and writes their entries in a transaction of
// their own that reads nothing, so that no transaction watches every job
// (on Redis, one transaction that read 100,000 jobs took two minutes to
// index them). The mark is written last: a broker stopped half
// way starts again from the beginning, and entries written twice are the
// same. Jobs are never deleted and their team never changes, and PutJob
// indexes every job written meanwhile, so the pieces add up to the index.
func EnsureTeamIndex(ctx context.Context, st Store) error {
	err := st.View(ctx, func(tx Tx) error {
		_, err := tx.Get(BucketMeta, metaTeamIndex)
		return err
	})
	if !errors.Is(err, ErrNotFound) {
		return err // nil: built already
	}
	for from := ""; ; {
		var keys []string
		if err := st.View(ctx, func(tx Tx) error {
			return tx.Scan(BucketJobs, from, "", func(id string, raw []byte) error {
				var j struct {
					Spec struct {
						Team string `json:"team"`
					} `json:"spec"`
				}
				if err := json.Unmarshal(raw, &j); err != nil {
					return fmt.Errorf("decode %s/%s: %w", BucketJobs, id, err)
				}
				keys = append(keys, teamJobKey(j.Spec.Team, id))
				from = id + "\x00"
				if len(keys) == teamIndexChunk {
					return ErrStopScan
				}
				return nil
			})
		}); err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		if err := st.Update(ctx, func(tx Tx) error {
			for _, k := range keys {
				if err := tx.Put(BucketTeamJobs, k, nil); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return st.Update(ctx, func(tx Tx) error { return tx.Put(BucketMeta, metaTeamIndex, []byte("1")) })
}

// teamIndexChunk is how many jobs EnsureTeamIndex indexes a transaction.
const teamIndexChunk = 1000
