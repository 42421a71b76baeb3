package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"
)

func checkpointCmd(g *globals) *cobra.Command {
	var job string
	cmd := &cobra.Command{
		Use:   "checkpoint STEP",
		Short: "Report from inside a job that it saved a checkpoint at STEP (preemption then counts lost work from now)",
		Long: `Report that the job saved its work at STEP. Inside a job nothing else is
needed: the broker gives every attempt SPILLWAY_JOB_ID, SPILLWAY_SERVER and a
job token (SPILLWAY_JOB_TOKEN). Preemption prefers victims that lose the
least work, counted from the latest report. See docs/data.md.

  torch.save(state, f"{os.environ['SPILLWAY_CHECKPOINT_DIR']}/step.pt")
  spillway checkpoint 1200`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			step, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || step < 0 {
				return fmt.Errorf("STEP must be a whole number of at least 0, not %q", args[0])
			}
			if job == "" {
				job = os.Getenv("SPILLWAY_JOB_ID")
			}
			if job == "" {
				return fmt.Errorf("--job is required outside a job (inside one, SPILLWAY_JOB_ID names it)")
			}
			c, err := g.jobClient()
			if err != nil {
				return err
			}
			ans, err := c.ReportCheckpoint(cmd.Context(), job, step)
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(ans)
			}
			fmt.Fprintf(g.stdout, "job %s: checkpoint saved at step %d\n", ans.Job, ans.Step)
			return nil
		},
	}
	cmd.Flags().StringVar(&job, "job", "", "the job (default $SPILLWAY_JOB_ID)")
	return cmd
}
