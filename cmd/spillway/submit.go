package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func submitCmd(g *globals) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "submit -f job.yaml",
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
			j, err := c.Submit(cmd.Context(), raw)
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(j)
			}
			fmt.Fprintf(g.stdout, "submitted %s (%s, team %s, queue %s)\n", j.ID, j.Spec.Name, j.Spec.Team, j.Spec.Queue)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "job spec file, or - for standard input")
	return cmd
}
