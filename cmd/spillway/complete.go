package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/client"
)

// Shell completion (spillway completion bash|zsh|fish) of what lives on the
// broker: job ids for the verbs that take a job, and the values of
// --queue, --priority and --team. Each asks the broker with the CLI's
// server and token, within two seconds; no answer completes nothing.

// jobVerbs take a job id as their arguments.
var jobVerbs = map[string]bool{"status": true, "cancel": true, "logs": true, "explain": true}

func addCompletions(root *cobra.Command, g *globals) {
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		if (jobVerbs[cmd.Name()] && cmd.Parent() == root) || (cmd.Parent() != nil && cmd.Parent().Name() == "job") {
			cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
				return completeJobs(g, prefix), cobra.ShellCompDirectiveNoFileComp
			}
		}
		for flag, values := range map[string]func(*client.Client, context.Context) []string{
			"queue": queueNames, "priority": priorityNames, "team": teamNames,
		} {
			if cmd.Flags().Lookup(flag) != nil {
				_ = cmd.RegisterFlagCompletionFunc(flag, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
					return withBroker(g, values), cobra.ShellCompDirectiveNoFileComp
				})
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

func withBroker(g *globals, f func(*client.Client, context.Context) []string) []string {
	c, err := g.client()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return f(c, ctx)
}

// completeJobs offers the newest jobs whose id starts with prefix, each
// with its name and state as the description.
func completeJobs(g *globals, prefix string) []string {
	return withBroker(g, func(c *client.Client, ctx context.Context) []string {
		page, err := c.Jobs(ctx, client.ListOptions{Limit: 200})
		if err != nil {
			return nil
		}
		var out []string
		for _, j := range page.Jobs {
			if strings.HasPrefix(j.ID, strings.ToUpper(prefix)) {
				out = append(out, j.ID+"\t"+j.Spec.Name+" "+string(j.State))
			}
		}
		return out
	})
}

func queueNames(c *client.Client, ctx context.Context) []string {
	qs, err := c.Queues(ctx, 1) // the names only
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(qs))
	for _, q := range qs {
		out = append(out, q.Name)
	}
	return out
}

func priorityNames(c *client.Client, ctx context.Context) []string {
	w, err := c.Whoami(ctx)
	if err != nil {
		return nil
	}
	return w.Priorities
}

func teamNames(c *client.Client, ctx context.Context) []string {
	w, err := c.Whoami(ctx)
	if err != nil {
		return nil
	}
	return w.Teams
}
