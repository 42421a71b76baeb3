package main

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/client"
)

func cancelCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel JOB|ARRAY...",
		Short: "Cancel jobs, or every job of an array (running ones get their checkpoint signal, the grace period, then a kill)",
		Long: `Cancel jobs by id (or a unique prefix of one). Given an array's id (the
one "spillway submit --array" prints), every element of the array that
has not ended is cancelled, as Slurm's scancel does.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			failed := 0
			for _, id := range args {
				j, err := c.Cancel(cmd.Context(), id)
				var a *api.ArrayCancelled
				isArray, err := asArray(id, err, func() (err error) { a, err = c.CancelArray(cmd.Context(), id); return err })
				if isArray {
					fmt.Fprintf(g.stdout, "array %s: %d cancelled, %d stopping, %d had ended (%d jobs)\n",
						a.ArrayID, len(a.Cancelled), len(a.Stopping), a.Ended, a.Count)
					continue
				}
				if err != nil {
					fmt.Fprintf(g.stderr, "%s: %v\n", id, err)
					failed++
					continue
				}
				switch {
				case j.ID == "" || j.State == "":
					fmt.Fprintf(g.stderr, "%s: the broker's answer names no job; check with `spillway status %s`\n", id, id)
					failed++
				case j.State.Terminal():
					fmt.Fprintf(g.stdout, "%s cancelled\n", j.ID)
				case j.Stop == nil:
					fmt.Fprintf(g.stdout, "%s stopping (%s)\n", j.ID, j.State)
				default:
					fmt.Fprintf(g.stdout, "%s stopping (%s, then kill after %s)\n", j.ID, j.Stop.Signal, j.Spec.Checkpoint.Grace)
				}
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
}

// asArray tries call, the same command for an array, when a command given
// id found no such job (err is the broker's 404) and id has the shape of
// an array's id: as with Slurm, an array's id names the whole array.
// It reports whether call did it; else the error to show: call's, or
// that neither a job nor an array has that id.
func asArray(id string, err error, call func() error) (bool, error) {
	if !isNotFound(err) || !broker.ValidArrayID(id) {
		return false, err
	}
	switch aerr := call(); {
	case aerr == nil:
		return true, nil
	case isNotFound(aerr):
		return false, fmt.Errorf("job or array %s not found", id)
	default:
		return false, aerr
	}
}

// isNotFound reports whether err is the broker's 404.
func isNotFound(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}
