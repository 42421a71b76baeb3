package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker/burst"
)

// Report is one replay of a trace under several policies.
type Report struct {
	Trace   TraceInfo   `json:"trace"`
	Cluster ClusterInfo `json:"cluster"`
	Seed    uint64      `json:"seed"`
	Results []*Result   `json:"results"`
	// Sweep, when asked for, is the cost-versus-JCT sweep.
	Sweep *SweepResult `json:"sweep,omitempty"`
}

// TraceInfo describes the replayed jobs.
type TraceInfo struct {
	Jobs     int       `json:"jobs"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	GPUHours float64   `json:"gpuHours"`
	// MeanDemand is the GPU-hours over the span between the first and the
	// last submit: the mean GPUs held if nothing ever waited.
	MeanDemand float64 `json:"meanDemand"`
}

// ClusterInfo describes the simulated cluster.
type ClusterInfo struct {
	Nodes      int    `json:"nodes"`
	OnPremGPUs int    `json:"onPremGPUs"`
	Offers     int    `json:"offers"`
	Currency   string `json:"currency"`
}

// Describe fills the report's trace and cluster sections.
func Describe(tr *Trace, c *Cluster, seed uint64) *Report {
	r := &Report{Seed: seed, Cluster: ClusterInfo{OnPremGPUs: c.OnPremGPUs(), Offers: len(c.Offers), Currency: c.Currency}}
	for _, g := range c.Groups {
		r.Cluster.Nodes += g.Count
	}
	r.Trace.Jobs = len(tr.Jobs)
	if len(tr.Jobs) > 0 {
		r.Trace.From, r.Trace.To = tr.Jobs[0].Submit.UTC(), tr.Jobs[len(tr.Jobs)-1].Submit.UTC()
	}
	for _, j := range tr.Jobs {
		r.Trace.GPUHours += float64(j.GPUs) * j.Duration.Hours()
	}
	if h := r.Trace.To.Sub(r.Trace.From).Hours(); h > 0 {
		r.Trace.MeanDemand = r.Trace.GPUHours / h
	}
	return r
}

// RunAll replays tr under every policy, up to GOMAXPROCS replays at once
// (each replay is single-threaded and deterministic), and returns the
// results in the policies' order.
func RunAll(tr *Trace, c *Cluster, pols []Policy, opt Options) ([]*Result, error) {
	out := make([]*Result, len(pols))
	errs := make([]error, len(pols))
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	var wg sync.WaitGroup
	for i := range pols {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = Run(tr, c, pols[i], opt)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", pols[i].Name, err)
		}
	}
	return out, nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for people.
func (r *Report) WriteTable(w io.Writer) error {
	t := r.Trace
	fmt.Fprintf(w, "trace: %d jobs, %s to %s, %.0f GPU-hours (mean demand %.0f GPUs without queueing)\n",
		t.Jobs, t.From.Format("2006-01-02 15:04"), t.To.Format("2006-01-02 15:04"), t.GPUHours, t.MeanDemand)
	fmt.Fprintf(w, "cluster: %d nodes, %d on-prem GPUs, %d offers; seed %d\n", r.Cluster.Nodes, r.Cluster.OnPremGPUs, r.Cluster.Offers, r.Seed)
	if len(r.Results) > 0 {
		fmt.Fprintf(w, "fluid lower bound on burst GPU-hours: %.0f\n\n", r.Results[0].FluidBoundGPUHours)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\twait p50\tp95\tp99\tJCT mean\tp95\ton-prem\tburst GPU-h\t×fluid\toverhead GPU-h\towned idle while renting\tburst cost\tmachines\tpreempt\tmoved home\tresume\t")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.0f\t%s\t%.0f\t%.0f (%.1f%%)\t%s\t%d\t%d\t%d\t%d\t\n", res.Policy,
			human(res.Wait.P50), human(res.Wait.P95), human(res.Wait.P99), human(res.JCT.Mean), human(res.JCT.P95),
			100*res.OnPremAllocation, res.BurstGPUHours, ratio(res.BurstOverFluid), res.OverheadGPUHours,
			res.OwnedIdleWhileRenting, 100*res.OwnedIdleShare,
			burst.Money(res.BurstCost), res.Machines, res.Preemptions, res.SpillBacks, res.Resumptions)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if slices.ContainsFunc(r.Results, func(res *Result) bool { return res.Reclaims > 0 }) {
		fmt.Fprintln(w, "\nspot reclaims (machines taken back, attempts they ended, work lost since the last checkpoint):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "policy\treclaims\tattempts\tlost GPU-h\t")
		for _, res := range r.Results {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t\n", res.Policy, res.Reclaims, res.ReclaimedAttempts, res.ReclaimLostGPUHours)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if slices.ContainsFunc(r.Results, func(res *Result) bool { return len(res.SpillBackRefusals) > 0 }) {
		fmt.Fprintln(w, "\nspill-back refusals while owned GPUs idle could hold burst jobs (machines × decisions, by rule):")
		var rules []string
		for _, res := range r.Results {
			for k := range res.SpillBackRefusals {
				rules = append(rules, k)
			}
		}
		slices.Sort(rules)
		rules = slices.Compact(rules)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "policy\t%s\t\n", strings.Join(rules, "\t"))
		for _, res := range r.Results {
			cells := []string{res.Policy}
			for _, k := range rules {
				cells = append(cells, fmt.Sprint(res.SpillBackRefusals[k]))
			}
			fmt.Fprintf(tw, "%s\t\n", strings.Join(cells, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\nwait by priority and queue (p50 / p95 / p99):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var keys []string
	for _, res := range r.Results {
		for k := range res.WaitByPriority {
			keys = append(keys, "priority "+k)
		}
		for k := range res.WaitByQueue {
			keys = append(keys, "queue "+k)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	fmt.Fprintf(tw, "policy\t%s\n", strings.Join(keys, "\t"))
	for _, res := range r.Results {
		cells := []string{res.Policy}
		for _, k := range keys {
			var s Stats
			var ok bool
			if name, found := strings.CutPrefix(k, "priority "); found {
				s, ok = res.WaitByPriority[name]
			} else {
				s, ok = res.WaitByQueue[strings.TrimPrefix(k, "queue ")]
			}
			if !ok {
				cells = append(cells, "-")
				continue
			}
			cells = append(cells, fmt.Sprintf("%s / %s / %s", human(s.P50), human(s.P95), human(s.P99)))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nwait of jobs larger than one node (gangs):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tjobs started\twait p50\tp95\tp99\t")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t\n", res.Policy, res.MultiNodeJobs,
			human(res.WaitMultiNode.P50), human(res.WaitMultiNode.P95), human(res.WaitMultiNode.P99))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nbudgets and burst machines:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tboot GPU-h\tidle GPU-h\toverhead cost\tjobs on burst\tlaunch failures\tcapacity errors\tbudget-blocked jobs\tmonths within budget")
	for _, res := range r.Results {
		within, months := 0, 0
		for _, b := range res.Budgets {
			months++
			if b.Within {
				within++
			}
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%s\t%d\t%d\t%d\t%d\t%d/%d\n", res.Policy, res.BootGPUHours, res.IdleGPUHours,
			burst.Money(res.OverheadCost), res.JobsOnBurst, res.LaunchFailures, res.CapacityErrors, res.BudgetBlockedJobs, within, months)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Sweep != nil {
		fmt.Fprintln(w)
		return r.Sweep.WriteTable(w, r.Cluster.Currency)
	}
	return nil
}

func ratio(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

// human prints seconds briefly: 0s, 45s, 12m, 3.4h, 2.1d.
func human(s float64) string {
	switch {
	case s < 1:
		return "0s"
	case s < 90:
		return fmt.Sprintf("%.0fs", s)
	case s < 90*60:
		return fmt.Sprintf("%.0fm", s/60)
	case s < 48*3600:
		return fmt.Sprintf("%.1fh", s/3600)
	}
	return fmt.Sprintf("%.1fd", s/86400)
}

// money is an amount in whole units, for charts and sweeps.
func money(a billing.Amount) float64 { return float64(a) / billing.MicrosPerUnit }
