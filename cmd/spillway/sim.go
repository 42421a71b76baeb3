package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/broker/sim"
)

func simCmd(g *globals) *cobra.Command {
	var (
		tracePath, format, clusterPath, policies, from, to, chart, cpuProfile, pricesPath string
		seed                                                                              uint64
		sweep                                                                             bool
	)
	cmd := &cobra.Command{
		Use:   "sim --trace FILE --cluster cluster.yaml",
		Short: "Replay a job trace through the real scheduler and burst decision, in virtual time",
		Long: `Replays a job trace through the scheduler core and the burst decision the
broker runs, on simulated nodes and providers, for each policy, and reports
waits, job completion times, on-prem allocation, burst GPU-hours and cost
against the fluid lower bound, and budget adherence (docs/sim.md).

Traces: the Philly extract (--format philly), Slurm accounting
(sacct --parsable2 -X -o JobID,Submit,Start,End,AllocTRES,Account;
--format sacct) or the generic CSV
(submit_s,duration_s,gpus,team,priority,queue; --format csv, what
'spillway sim export-trace' writes). --format auto picks by the header.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if tracePath == "" || clusterPath == "" {
				return fmt.Errorf("--trace and --cluster are required")
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("start profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			cl, err := sim.LoadCluster(clusterPath)
			if err != nil {
				return err
			}
			tr, err := readTrace(tracePath, format, seed)
			if err != nil {
				return err
			}
			var lo, hi time.Time
			if from != "" {
				if lo, err = sim.ParseTime(from, tr.Location); err != nil {
					return fmt.Errorf("--from: %w", err)
				}
			}
			if to != "" {
				if hi, err = sim.ParseTime(to, tr.Location); err != nil {
					return fmt.Errorf("--to: %w", err)
				}
			}
			tr = tr.Window(lo, hi)
			pols, err := sim.ParsePolicies(policies, cl)
			if err != nil {
				return err
			}
			opt := sim.Options{Seed: seed}
			if pricesPath != "" {
				if opt.Prices, err = sim.LoadPrices(pricesPath, cl); err != nil {
					return err
				}
			}
			t0 := time.Now()
			rep := sim.Describe(tr, cl, seed)
			if rep.Results, err = sim.RunAll(tr, cl, pols, opt); err != nil {
				return err
			}
			if sweep {
				if rep.Sweep, err = sim.Sweep(tr, cl, opt); err != nil {
					return err
				}
			}
			if chart != "" {
				if err := writeChart(chart, rep); err != nil {
					return err
				}
			}
			if g.json() {
				return rep.WriteJSON(g.stdout)
			}
			if err := rep.WriteTable(g.stdout); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "\nreplayed %d jobs under %d policies in %s\n", len(tr.Jobs), len(pols)+sweepCount(rep), time.Since(t0).Round(10*time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&tracePath, "trace", "", "job trace file")
	f.StringVar(&format, "format", "auto", "trace format: philly, csv, sacct (sacct --parsable2 with JobID,Submit,Start,End,AllocTRES,Account; times in $TZ) or auto")
	f.StringVar(&clusterPath, "cluster", "", "cluster config (deploy/sim/cluster.yaml is the standard scenario)")
	f.StringVar(&policies, "policy", sim.AllPolicies, "comma-separated policies, each NAME[:key=value…] (docs/sim.md)")
	f.Uint64Var(&seed, "seed", 1, "seed for priorities (Philly), lead times and capacity failures")
	f.StringVar(&from, "from", "", "replay jobs submitted at or after this date or time (in the trace's zone)")
	f.StringVar(&to, "to", "", "replay jobs submitted before this date or time (in the trace's zone)")
	f.StringVar(&chart, "chart", "", "write an SVG chart (on-prem GPUs busy, burst GPUs, queue depth) to this file")
	f.BoolVar(&sweep, "sweep", false, "also sweep spillway's threshold × minimum wait against starburst-linear-cost's waiting budget")
	f.StringVar(&pricesPath, "prices", "", "live-price series: CSV (time,provider,instanceType,price[,market]) or JSON lines; the offers' prices change over virtual time")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the replay to this file")
	cmd.AddCommand(exportTraceCmd(g))
	return cmd
}

func sweepCount(r *sim.Report) int {
	if r.Sweep == nil {
		return 0
	}
	return len(r.Sweep.Points)
}

// readTrace reads a trace file in the given format ("auto": by header).
func readTrace(path, format string, seed uint64) (*sim.Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	if format == "auto" {
		head := make([]byte, 64)
		n, _ := io.ReadFull(f, head)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("read trace: %w", err)
		}
		format = "csv"
		if strings.HasPrefix(string(head[:n]), "timestamp,duration,num_gpus") {
			format = "philly"
		}
		if strings.HasPrefix(string(head[:n]), "JobID|") {
			format = "sacct"
		}
	}
	switch format {
	case "philly":
		return sim.ReadPhilly(f, sim.PhillyOptions{Seed: seed})
	case "csv":
		return sim.ReadCSV(f)
	case "sacct":
		// sacct prints times in the zone of the host that ran it: TZ here.
		return sim.ReadSacct(f, sim.SacctOptions{Location: time.Local})
	}
	return nil, fmt.Errorf("--format must be philly, csv, sacct or auto, not %q", format)
}

func writeChart(path string, rep *sim.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create chart: %w", err)
	}
	if err := sim.WriteChart(f, rep); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func exportTraceCmd(g *globals) *cobra.Command {
	var out, team string
	cmd := &cobra.Command{
		Use:   "export-trace",
		Short: "Write the broker's finished jobs as a generic trace CSV for `spillway sim`",
		Long: `Lists the broker's finished jobs (succeeded, failed, cancelled, timed out)
through the API and writes them as the simulator's generic CSV: submit time
relative to the first job, run time summed over attempts, GPUs, team,
priority and queue. Jobs that never ran are left out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			jobs, err := listFinished(cmd, c, team)
			if err != nil {
				return err
			}
			tr := sim.TraceFromJobs(jobs)
			var w io.Writer = g.stdout
			if out != "" && out != "-" {
				if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
					return err
				}
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if err := sim.WriteCSV(w, tr); err != nil {
				return err
			}
			if w != g.stdout {
				fmt.Fprintf(g.stderr, "wrote %d jobs to %s\n", len(tr.Jobs), out)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "file", "f", "-", "write to this file (- for standard output)")
	cmd.Flags().StringVar(&team, "team", "", "only this team's jobs")
	return cmd
}

// listFinished pages through the broker's finished jobs.
func listFinished(cmd *cobra.Command, c *client.Client, team string) ([]*broker.Job, error) {
	var out []*broker.Job
	cursor := ""
	for {
		page, err := c.Jobs(cmd.Context(), client.ListOptions{Team: team, Limit: 1000, Cursor: cursor,
			States: []broker.State{broker.StateSucceeded, broker.StateFailed, broker.StateCancelled, broker.StateTimedOut}})
		if err != nil {
			return nil, fmt.Errorf("list jobs: %w", err)
		}
		out = append(out, page.Jobs...)
		if page.Next == "" || len(page.Jobs) == 0 {
			break
		}
		cursor = page.Next
	}
	slices.SortFunc(out, func(a, b *broker.Job) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
