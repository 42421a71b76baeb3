package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
)

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status JOB",
		Short: "Show a job: its spec, where it runs or why it waits, and its whole history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(g, cmd, func(c *client.Client) (*broker.Job, error) { return c.Job(cmd.Context(), args[0]) },
				func(j *broker.Job) error { printStatus(g, j); return nil })
		},
	}
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
	if j.Progress != "" {
		fmt.Fprintf(w, "Starting:\t%s\n", j.Progress)
	}
	if j.IdleSince != nil {
		fmt.Fprintf(w, "Idle:\tsince %s: its GPUs hold memory but compute almost nothing\n", j.IdleSince.Local().Format("2006-01-02 15:04"))
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
