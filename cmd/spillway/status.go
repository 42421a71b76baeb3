package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
)

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status JOB|ARRAY",
		Short: "Show a job: its spec, where it runs or why it waits, and its whole history; or an array at a glance",
		Long: `Show a job by id (or a unique prefix of one). Given an array's id (the
one "spillway submit --array" prints), show the array at a glance: its
elements by state, the indexes still waiting and why.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			id := args[0]
			j, err := c.Job(cmd.Context(), id)
			var a *api.ArrayView
			isArray, err := asArray(id, err, func() (err error) { a, err = c.Array(cmd.Context(), id); return err })
			switch {
			case err != nil:
				return err
			case isArray && g.json():
				return g.printJSON(a)
			case isArray:
				printArray(g, a)
			case g.json():
				return g.printJSON(j)
			default:
				printStatus(g, j)
			}
			return nil
		},
	}
}

// printArray shows an array at a glance, as squeue shows an array's
// waiting elements on one line.
func printArray(g *globals, a *api.ArrayView) {
	w := g.table()
	if a.Name != "" {
		fmt.Fprintf(w, "Array:\t%s (%s)\n", a.ArrayID, a.Name)
	} else {
		fmt.Fprintf(w, "Array:\t%s\n", a.ArrayID)
	}
	fmt.Fprintf(w, "Jobs:\t%d, indexes %s\n", a.Count, a.Indexes)
	limit := "no limit"
	if a.Limit > 0 {
		limit = fmt.Sprintf("at most %d running at once", a.Limit)
	}
	fmt.Fprintf(w, "Limit:\t%s\n", limit)
	fmt.Fprintf(w, "States:\t%s\n", arrayCounts(a))
	if a.PendingIndexes != "" {
		fmt.Fprintf(w, "Waiting:\tindexes %s (%s)\n", a.PendingIndexes, waitingCodes(a))
	}
	fmt.Fprintf(w, "Team / queue / priority:\t%s / %s / %s\n", a.Team, a.Queue, a.Priority)
	fmt.Fprintf(w, "User:\t%s\n", a.User)
	fmt.Fprintf(w, "GPUs each:\t%d\n", a.GPUs)
	fmt.Fprintf(w, "Submitted:\t%s\n", a.SubmittedAt.Local().Format(time.DateTime))
	_ = w.Flush()
}

// waitingCodes is an array's waiting elements by reason code, as
// "array_limit 985, held 3".
func waitingCodes(a *api.ArrayView) string {
	var why []string
	for _, code := range slices.Sorted(maps.Keys(a.Waiting)) {
		why = append(why, fmt.Sprintf("%s %d", code, a.Waiting[code]))
	}
	return strings.Join(why, ", ")
}

func printStatus(g *globals, j *broker.Job) {
	w := g.table()
	r := j.Spec.Resources
	fmt.Fprintf(w, "Job:\t%s (%s)\n", j.ID, j.Spec.Name)
	fmt.Fprintf(w, "State:\t%s\n", j.State)
	if j.State == broker.StatePending && j.Pending != nil {
		fmt.Fprintf(w, "Waiting:\t%s\n", j.Pending.Message)
		if j.Pending.EstimatedStart != nil {
			fmt.Fprintf(w, "Est. start:\t%s\n", j.Pending.EstimatedStart.Local().Format("2006-01-02 15:04"))
		}
	}
	if line := dataLine(j); line != "" {
		fmt.Fprintf(w, "Data:\t%s\n", line)
	}
	if j.CheckpointStep != nil && j.LastCheckpointAt != nil {
		fmt.Fprintf(w, "Checkpoint:\tsaved at step %d, %s\n", *j.CheckpointStep, j.LastCheckpointAt.Local().Format("2006-01-02 15:04:05"))
	}
	if j.DataWait != nil && j.DataWait.Active {
		fmt.Fprintf(w, "GPU waits on data:\t%d%% compute while reading %.1f MB/s since %s; stage the data as inputs (cache: true) to read it from the node's cache\n",
			j.DataWait.SMUtil, float64(j.DataWait.ReadBytesPerSec)/1e6, j.DataWait.Since.Local().Format("2006-01-02 15:04"))
	}
	if j.Progress != "" {
		fmt.Fprintf(w, "Starting:\t%s\n", j.Progress)
	}
	if j.IdleSince != nil {
		fmt.Fprintf(w, "Idle:\tsince %s: its GPUs hold memory but compute almost nothing\n", j.IdleSince.Local().Format("2006-01-02 15:04"))
	}
	if j.ArrayIndex != nil {
		limit := ""
		if j.ArrayLimit > 0 {
			limit = fmt.Sprintf(" (at most %d running at once)", j.ArrayLimit)
		}
		fmt.Fprintf(w, "Array:\t%s, index %d%s\n", j.ArrayID, *j.ArrayIndex, limit)
	}
	fmt.Fprintf(w, "Team / project:\t%s / %s\n", j.Spec.Team, dash(j.Spec.Project))
	fmt.Fprintf(w, "User:\t%s\n", j.User)
	fmt.Fprintf(w, "Queue / priority:\t%s / %s\n", j.Spec.Queue, j.Spec.Priority)
	res := fmt.Sprintf("%d GPU", r.GPUs)
	if r.GPUs != 1 {
		res += "s"
	}
	if r.Nodes > 1 {
		res += fmt.Sprintf(" × %d nodes", r.Nodes)
	}
	if r.GPUModel != "" {
		res += " " + r.GPUModel
	}
	if r.GPUMemory > 0 {
		res += fmt.Sprintf(", %s GPU memory", r.GPUMemory)
	}
	fmt.Fprintf(w, "Resources:\t%s\n", res)
	fmt.Fprintf(w, "Timeout:\t%s\n", j.Spec.Timeout)
	fmt.Fprintf(w, "Command:\t%s\n", strings.Join(quoteArgs(j.Spec.Command), " "))
	if len(j.Placements) > 0 {
		for _, p := range j.Placements {
			fmt.Fprintf(w, "Placement:\t%s GPUs %v %s\n", p.Node, p.GPUs, strings.Join(p.UUIDs, ","))
		}
	}
	fmt.Fprintf(w, "Attempt:\t%d (retries %d/%d)\n", j.Attempt, j.Retries, j.Spec.MaxRetries)
	if j.ExitCode != nil {
		fmt.Fprintf(w, "Exit:\t%d %s\n", *j.ExitCode, j.Signal)
	}
	_ = w.Flush()
	fmt.Fprintln(g.stdout, "\nHistory:")
	w = g.table()
	fmt.Fprintln(w, "  TIME\tFROM\tTO\tREASON\tDETAIL")
	for _, t := range j.History {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", t.At.Local().Format(time.DateTime), dash(string(t.From)), t.To, t.Reason, t.Detail)
	}
	_ = w.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func quoteArgs(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$\\") {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		} else {
			out[i] = a
		}
	}
	return out
}

// dataLine is the staging of the job's current attempt as people read it:
// "staging inputs 3.1/10.0 GB", "restored checkpoint …, inputs 10.0 GB
// (8.0 GB from the node cache)".
func dataLine(j *broker.Job) string {
	d := j.Data
	if d == nil || d.Attempt != j.Attempt {
		return ""
	}
	phase := map[string]string{"restore": "restoring checkpoint", "inputs": "staging inputs",
		"checkpoint": "uploading checkpoint", "outputs": "uploading outputs"}[d.Phase]
	var parts []string
	if phase != "" {
		if d.Total > 0 {
			phase += fmt.Sprintf(" %.1f/%.1f GB", float64(d.Done)/1e9, float64(d.Total)/1e9)
		}
		parts = append(parts, phase)
	}
	if d.Restored != "" {
		parts = append(parts, "resumed from checkpoint "+d.Restored)
	}
	if d.InputBytes > 0 {
		parts = append(parts, fmt.Sprintf("inputs %.1f GB (%.1f GB from the node cache)", float64(d.InputBytes)/1e9, float64(d.CacheHitBytes)/1e9))
	}
	if d.Checkpoint != "" {
		parts = append(parts, "last checkpoint uploaded "+d.Checkpoint)
	}
	if d.Error != "" {
		parts = append(parts, "error: "+printable(d.Error))
	}
	return strings.Join(parts, "; ")
}

// printable drops control characters from a message that may carry text
// from an object store, so nothing reaches the terminal unescaped.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return -1
		}
		return r
	}, s)
}
