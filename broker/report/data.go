package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// What explain and the utilisation report say about jobs' data: staging,
// failed inputs and outputs, GPUs that wait on storage.

// dataFailVerdict explains a job that failed on its data.
func dataFailVerdict(j *broker.Job) (api.ExplainVerdict, bool) {
	if len(j.History) == 0 {
		return api.ExplainVerdict{}, false
	}
	last := j.History[len(j.History)-1]
	switch last.Reason {
	case agentapi.ReasonInputMissing:
		return verdict(VerdictInputMissing, fmt.Sprintf("The job failed before it started: %s. Check the location (and that the team's buckets allow it), then submit again; it is not retried.", last.Detail)), true
	case agentapi.ReasonOutputsFailed:
		return verdict(VerdictOutputs, fmt.Sprintf("The job ran, but its outputs could not be uploaded after retries (%s); check the bucket is reachable from the node and the node's credentials may write to it.", last.Detail)), true
	}
	return api.ExplainVerdict{}, false
}

// dataRunVerdict explains a running job that is staging, or whose GPUs
// wait on data.
func dataRunVerdict(j *broker.Job) (api.ExplainVerdict, bool) {
	if d := j.Data; d != nil && d.Attempt == j.Attempt {
		if msg := stagingLine(d); msg != "" && d.Phase != agentapi.PhaseRunning {
			return verdict(VerdictStaging, fmt.Sprintf("The job holds its GPUs and is %s; this time is charged as staging, apart from compute. Inputs read through the node's cache stage in a fraction of the time the next time.", msg)), true
		}
	}
	if w := j.DataWait; w != nil && w.Active {
		return verdict(VerdictDataWait, fmt.Sprintf("GPU waits on data: the job's cards compute %d%% while it reads %s/s from storage (since %s). Stage the data as inputs so it is read from the node's local cache (inputs with cache: true), use more data-loader workers, or prefetch.",
			w.SMUtil, formatBytes(w.ReadBytesPerSec), w.Since.UTC().Format("15:04 UTC Jan 2"))), true
	}
	return api.ExplainVerdict{}, false
}

// stagingLine is "staging inputs 3.1/10 GB" for a job's data state.
func stagingLine(d *broker.JobData) string {
	if d == nil {
		return ""
	}
	what := map[string]string{
		agentapi.PhaseRestore:    "restoring its checkpoint",
		agentapi.PhaseInputs:     "staging inputs",
		agentapi.PhaseCheckpoint: "uploading its checkpoint",
		agentapi.PhaseOutputs:    "uploading outputs",
	}[d.Phase]
	if what == "" {
		return ""
	}
	if d.Total > 0 {
		return fmt.Sprintf("%s %s/%s", what, gbNum(d.Done), formatBytes(d.Total))
	}
	return what
}

func gbNum(b int64) string { return fmt.Sprintf("%.1f", float64(b)/1e9) }

// formatBytes is a decimal size: 10 GB, 3.1 GB, 200 MB.
func formatBytes(b int64) string {
	switch {
	case b >= 1e9:
		return trimZero(fmt.Sprintf("%.1f", float64(b)/1e9)) + " GB"
	case b >= 1e6:
		return trimZero(fmt.Sprintf("%.1f", float64(b)/1e6)) + " MB"
	case b >= 1e3:
		return trimZero(fmt.Sprintf("%.1f", float64(b)/1e3)) + " kB"
	}
	return fmt.Sprintf("%d B", b)
}

func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }

const dataWaitHint = "stage the data as inputs with cache: true so it is read from the node's local cache; more data-loader workers or prefetching also help"

// dataWaits lists the jobs the broker holds whose data wait overlaps the
// period (of one team, or all when team is empty), longest first.
func dataWaits(v View, p billing.Period, team string) []api.DataWaitJob {
	out := []api.DataWaitJob{}
	for j := range v.Jobs() {
		w := j.DataWait
		if w == nil || (team != "" && j.Spec.Team != team) || !w.Last.After(p.From) || !w.Since.Before(p.To) {
			continue
		}
		out = append(out, api.DataWaitJob{Job: j.ID, Team: j.Spec.Team, Since: w.Since, Last: w.Last, Active: w.Active, SMUtil: w.SMUtil,
			ReadBytesPerSec: w.ReadBytesPerSec, Flag: "GPU waits on data", Hint: dataWaitHint})
	}
	slices.SortFunc(out, func(a, b api.DataWaitJob) int {
		if da, db := a.Last.Sub(a.Since), b.Last.Sub(b.Since); da != db {
			return cmp.Compare(db, da)
		}
		return strings.Compare(a.Job, b.Job)
	})
	return out
}
