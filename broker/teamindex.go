package broker

import "encoding/json"

// BucketTeamJobs indexes jobs by team: "<team>/<job id>" → "" for every
// job, kept by PutJob, so a team's listing reads that team's jobs only.
const BucketTeamJobs Bucket = "teamjobs"

// metaTeamIndex marks a store whose team index covers every job.
const metaTeamIndex = "index/teamjobs"

func teamJobKey(team, id string) string { return team + "/" + id }

// EnsureTeamIndex builds the team index of a store written before it
// existed (once; later calls find the mark and return).
func EnsureTeamIndex(tx Tx) error {
	if _, err := tx.Get(BucketMeta, metaTeamIndex); err == nil {
		return nil
	}
	err := tx.Scan(BucketJobs, "", "", func(id string, raw []byte) error {
		var j struct {
			Spec struct {
				Team string `json:"team"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return err
		}
		return tx.Put(BucketTeamJobs, teamJobKey(j.Spec.Team, id), nil)
	})
	if err != nil {
		return err
	}
	return tx.Put(BucketMeta, metaTeamIndex, []byte("1"))
}
