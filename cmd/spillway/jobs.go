package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/client"
)

func jobsCmd(g *globals) *cobra.Command {
	var o client.ListOptions
	var states string
	var all, expand bool
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List active jobs, newest first (--all: finished ones too)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			for _, s := range strings.Split(states, ",") {
				if s = strings.TrimSpace(s); s != "" {
					o.States = append(o.States, broker.State(s))
				}
			}
			if len(o.States) == 0 && !all {
				// Active jobs by default, as ps shows running processes.
				o.States = activeStates
			}
			// As squeue does, the table shows an array's waiting elements
			// on one line; JSON keeps one record per job.
			o.FoldArrays = !expand && o.Array == "" && !g.json()
			c, err := g.client()
			if err != nil {
				return err
			}
			var jobs []*broker.Job
			folds := map[*broker.Job]api.ArrayView{}
			for {
				page, err := c.Jobs(cmd.Context(), o)
				if err != nil {
					return err
				}
				jobs = append(jobs, page.Jobs...)
				for _, j := range page.Jobs {
					if a, ok := page.Arrays[j.ArrayID]; ok && j.State == broker.StatePending {
						folds[j] = a
					}
				}
				if !all || page.Next == "" {
					if !all && page.Next != "" && !g.json() {
						defer fmt.Fprintf(g.stderr, "(more: --cursor %s, or --all)\n", page.Next)
					}
					break
				}
				o.Cursor = page.Next
			}
			if g.json() {
				return g.printJSON(jobs)
			}
			now := time.Now()
			w := g.table()
			fmt.Fprintln(w, "ID\tNAME\tTEAM\tQUEUE\tPRIO\tGPUS\tSTATE\tAGE\tWHERE / WHY")
			for _, j := range jobs {
				id, name, why := j.ID, jobName(j), whereOrWhy(j)
				if a, ok := folds[j]; ok {
					id, name, why = a.ArrayID, foldedName(&a), fmt.Sprintf("%d waiting: %s", a.Count, waitingCodes(&a))
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", id, name, j.Spec.Team, j.Spec.Queue,
					j.Spec.Priority, j.TotalGPUs(), j.State, ago(now, j.SubmittedAt), why)
			}
			return w.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&states, "state", "", "only these states, comma-separated (e.g. pending,running)")
	f.StringVar(&o.Team, "team", "", "only this team (operators)")
	f.StringVar(&o.Queue, "queue", "", "only this queue")
	f.IntVar(&o.Limit, "limit", 50, "page size")
	f.StringVar(&o.Cursor, "cursor", "", "continue after this job id")
	f.StringVar(&o.Array, "array", "", "only the jobs of this array (the id `spillway submit --array` prints); with --all, ended ones too")
	f.BoolVar(&all, "all", false, "finished jobs too, every page")
	f.BoolVarP(&expand, "expand-arrays", "r", false, "one line per waiting array element (as squeue -r), not one line per array")
	return cmd
}

// activeStates are the states `spillway jobs` lists without --all.
var activeStates = []broker.State{broker.StatePending, broker.StateProvisioning, broker.StateStarting,
	broker.StateRunning, broker.StatePreempted, broker.StateLost}

// jobName is a job's name, with its index when it is an array's element
// (eval[7]).
func jobName(j *broker.Job) string { return broker.ElementName(j.Spec.Name, j.ArrayIndex) }

// foldedName names an array's waiting elements on one line, as squeue
// does: eval[12-999%10].
func foldedName(a *api.ArrayView) string {
	idx := a.PendingIndexes
	if a.Limit > 0 {
		idx += fmt.Sprintf("%%%d", a.Limit)
	}
	return fmt.Sprintf("%s[%s]", a.Name, idx)
}

// whereOrWhy is where a job runs, or why it does not.
func whereOrWhy(j *broker.Job) string {
	switch {
	case j.State == broker.StatePending && j.Pending != nil:
		return j.Pending.Message
	case j.State.Holding() || j.State.Terminal():
		if len(j.Placements) > 0 {
			return strings.Join(j.Nodes(), ",")
		}
	}
	if len(j.History) > 0 {
		return j.History[len(j.History)-1].Detail
	}
	return ""
}
