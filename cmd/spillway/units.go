package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/client"
)

func unitsCmd(g *globals) *cobra.Command {
	var job, kind, id string
	cmd := &cobra.Command{
		Use:   "units COUNT",
		Short: "Report units of output (requests, tokens, samples) a job produced, for cost per unit",
		Long: `Report units of output for a job. Inside a job nothing else is needed: the
broker gives every attempt SPILLWAY_JOB_ID, SPILLWAY_SERVER and a job token
(SPILLWAY_JOB_TOKEN) that may report units for that job and nothing else.

  spillway units 125000 --kind tokens
  spillway units 1 --kind requests --id req-7f3a   # a resend with the same id counts once`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			n, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || n < 1 {
				return fmt.Errorf("COUNT must be a whole number of at least 1, not %q", args[0])
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
			ans, err := c.ReportUnits(cmd.Context(), job, api.UnitsRequest{Units: n, Kind: kind, ID: id})
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(ans)
			}
			if ans.Duplicate {
				fmt.Fprintf(g.stdout, "already recorded (id %s); job %s has %d %s\n", id, job, ans.Total, ans.Kind)
				return nil
			}
			fmt.Fprintf(g.stdout, "recorded %d %s; job %s has %d\n", n, ans.Kind, job, ans.Total)
			return nil
		},
	}
	cmd.Flags().StringVar(&job, "job", "", "the job (default $SPILLWAY_JOB_ID)")
	cmd.Flags().StringVar(&kind, "kind", "units", "what was produced: tokens, requests, samples, …")
	cmd.Flags().StringVar(&id, "id", "", "idempotency id: a resend with the same id counts once")
	return cmd
}

// jobClient is the client of the verbs a job calls about itself (units,
// checkpoint): inside a job, with no other token given, it carries the
// job's own token (SPILLWAY_JOB_TOKEN) to SPILLWAY_SERVER, trusting
// --ca or SPILLWAY_CA; elsewhere it is the ordinary client.
func (g *globals) jobClient() (*client.Client, error) {
	tok := os.Getenv("SPILLWAY_JOB_TOKEN")
	if tok == "" || g.token != "" || os.Getenv("SPILLWAY_TOKEN") != "" {
		return g.client()
	}
	c := client.New(firstNonEmpty(g.server, os.Getenv("SPILLWAY_SERVER"), "http://127.0.0.1:8080"), tok)
	if ca := firstNonEmpty(g.ca, os.Getenv("SPILLWAY_CA")); ca != "" {
		if err := c.TrustCAFile(ca); err != nil {
			return nil, err
		}
	}
	return c, nil
}
