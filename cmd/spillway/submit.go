package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/api"
)

func submitCmd(g *globals) *cobra.Command {
	var file, array string
	cmd := &cobra.Command{
		Use:   "submit -f job.yaml [--array 0-999]",
		Short: "Submit a job spec (YAML or JSON; - reads standard input)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if file == "" {
				return fmt.Errorf("-f is required: the job spec file (see docs/jobs.md)")
			}
			var raw []byte
			var err error
			if file == "-" {
				raw, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
			} else {
				raw, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("read spec: %w", err)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sub, err := c.SubmitArray(cmd.Context(), raw, array)
			if err != nil {
				return err
			}
			if a := sub.Array; a != nil {
				return printArraySubmitted(g, a)
			}
			j := sub.Job
			if g.json() {
				return g.printJSON(j)
			}
			fmt.Fprintf(g.stdout, "submitted %s (%s, team %s, queue %s)\n", j.ID, j.Spec.Name, j.Spec.Team, j.Spec.Queue)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "job spec file, or - for standard input")
	cmd.Flags().StringVar(&array, "array", "", arrayFlagUsage)
	return cmd
}

// arrayFlagUsage is --array's help, for submit and run alike.
const arrayFlagUsage = "submit one job per index, as Slurm's --array: 0-999, 1,3,5-7 or 0-15:4, and %N for at most N running at once (0-999%10); each job reads its index from SPILLWAY_ARRAY_INDEX"

// printArraySubmitted says what an array submit made: its id and its first
// and last elements (-o json: the whole answer).
func printArraySubmitted(g *globals, a *api.ArraySubmitted) error {
	if g.json() {
		return g.printJSON(a)
	}
	fmt.Fprintf(g.stdout, "submitted array %s: %d jobs, %s (index %d) to %s (index %d)\n",
		a.ArrayID, a.Count, a.Jobs[0], a.Indexes[0], a.Jobs[len(a.Jobs)-1], a.Indexes[len(a.Indexes)-1])
	return nil
}
