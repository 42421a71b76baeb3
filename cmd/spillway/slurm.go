package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/broker/slurm"
)

// slurmCmd is what slurm.conf names as ResumeProgram and SuspendProgram
// (docs/slurm.md). slurmctld runs them with a bare environment, so a
// wrapper script sets SPILLWAY_CONFIG (server and operator token).
func slurmCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "slurm",
		Short: "Spillway as Slurm's burst provider: ResumeProgram and SuspendProgram",
	}
	var scontrol string
	resume := &cobra.Command{
		Use:   "resume NODELIST",
		Short: "Give Slurm CLOUD nodes machines (slurm.conf ResumeProgram)",
		Long: `Asks the broker for a machine behind each node of the hostlist
("burst-[1-4]"). The broker launches within the budget, bootstraps slurmd
over SSH and sets the node's address; a node the budget refuses is set
DOWN with the reason ("spillway: budget nlp exhausted"). The jobs of
SLURM_RESUME_FILE travel along, so a refusal is written on them too.
If the broker cannot be reached, the nodes are set DOWN with that reason
(through scontrol, as SlurmUser) instead of waiting out ResumeTimeout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			names, err := slurm.Expand(args[0])
			if err != nil {
				return err
			}
			req := api.SlurmRequest{Nodes: args[0]}
			if f := os.Getenv("SLURM_RESUME_FILE"); f != "" {
				if raw, err := os.ReadFile(f); err == nil {
					var rf struct {
						Jobs []api.SlurmResumeJob `json:"jobs"`
					}
					if err := json.Unmarshal(raw, &rf); err == nil {
						req.Jobs = rf.Jobs
					}
				}
			}
			return g.slurmCall(cmd, names, scontrol, func(ctx context.Context, c *client.Client) (*api.SlurmResult, error) {
				return c.SlurmResume(ctx, req)
			})
		},
	}
	resume.Flags().StringVar(&scontrol, "scontrol", "scontrol", "scontrol, to set the nodes DOWN when the broker cannot be reached")
	suspend := &cobra.Command{
		Use:   "suspend NODELIST",
		Short: "End the machines behind Slurm nodes (slurm.conf SuspendProgram)",
		Long: `Asks the broker to end the machine behind each node of the hostlist:
it waits for jobs still running there (draining the node), records the
node's jobs for the ledger, stops slurmd and deletes the machine.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			names, err := slurm.Expand(args[0])
			if err != nil {
				return err
			}
			return g.slurmCall(cmd, names, "", func(ctx context.Context, c *client.Client) (*api.SlurmResult, error) {
				return c.SlurmSuspend(ctx, api.SlurmRequest{Nodes: args[0]})
			})
		},
	}
	cmd.AddCommand(resume, suspend)
	return cmd
}

// slurmCall makes the request, retrying for a minute while the broker is
// unreachable, and prints one line per node.
func (g *globals) slurmCall(cmd *cobra.Command, names []string, scontrol string, call func(context.Context, *client.Client) (*api.SlurmResult, error)) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	var res *api.SlurmResult
	deadline := time.Now().Add(time.Minute)
	for {
		res, err = call(ctx, c)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		var api *client.APIError
		if errors.As(err, &api) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil {
		if scontrol != "" {
			reason := "spillway: broker unreachable: " + err.Error()
			if len(reason) > 200 {
				reason = reason[:200]
			}
			for _, n := range names {
				_ = exec.CommandContext(ctx, scontrol, "update", "nodename="+n, "state=DOWN", "reason="+strings.Join(strings.Fields(reason), " ")).Run()
			}
		}
		return err
	}
	if g.output == "json" {
		return g.printJSON(res)
	}
	for _, n := range res.Nodes {
		line := n.Node + " " + n.Action
		for _, s := range []string{n.Record, n.Offer, n.Reason} {
			if s != "" {
				line += " " + s
			}
		}
		fmt.Fprintln(g.stdout, strings.ToValidUTF8(line, "?"))
	}
	return nil
}
