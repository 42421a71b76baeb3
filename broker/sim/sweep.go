package sim

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// SweepPoint is one configuration of a sweep and what it did.
type SweepPoint struct {
	Policy string `json:"policy"`
	// Family is FamilySpillway, FamilyCostWait or FamilyStarburst.
	Family string `json:"family"`
	// MeanJCT and P95Wait in seconds; Cost is the burst cost in currency
	// units.
	MeanJCT       float64 `json:"meanJCT_s"`
	P95Wait       float64 `json:"p95Wait_s"`
	Cost          float64 `json:"cost"`
	BurstGPUHours float64 `json:"burstGPUHours"`
	// WaitPerGPUHour is the burst.waitPerGPUHour a costWait point ran
	// with: the value to put in the broker's config for that point.
	WaitPerGPUHour time.Duration `json:"waitPerGPUHour,omitempty"`
	// Frontier marks the points no other point of the family beats on
	// both JCT and cost.
	Frontier bool `json:"frontier"`
}

// Sweep families.
const (
	// FamilySpillway is the spillway policy with thresholds and minimum
	// waits (burst.threshold, burst.minWait, per-queue minWait).
	FamilySpillway = "spillway"
	// FamilyCostWait is spillway with burst.waitPerGPUHour: a per-job
	// minimum wait in proportion to GPUs × declared timeout (costWait=β
	// calibrates it).
	FamilyCostWait = "spillway+costWait"
	// FamilyAny is every spillway configuration of the sweep, both
	// families: what an operator can choose from.
	FamilyAny = "spillway (any)"
	// FamilyStarburst is Starburst's linear_cost.
	FamilyStarburst = PolicyStarburstCost
)

// FrontierCheck compares one Starburst point with a spillway family: the
// cheapest configuration of the family whose mean JCT is no longer.
type FrontierCheck struct {
	Family        string  `json:"family"`
	Starburst     string  `json:"starburst"`
	MeanJCT       float64 `json:"meanJCT_s"`
	StarburstCost float64 `json:"starburstCost"`
	// Spillway is the cheapest point of the family with MeanJCT at most
	// the Starburst point's; empty when none is that fast.
	Spillway     string  `json:"spillway,omitempty"`
	SpillwayJCT  float64 `json:"spillwayJCT_s,omitempty"`
	SpillwayCost float64 `json:"spillwayCost,omitempty"`
	AtOrBelow    bool    `json:"atOrBelow"`
	// Gap is the family's frontier (its frontier points joined by
	// straight lines) at the Starburst point's JCT, relative to the
	// Starburst cost: -0.02 is 2% cheaper. Absent when the JCT is
	// outside the family's range.
	Gap *float64 `json:"gap,omitempty"`
}

// SweepResult is a cost-versus-JCT sweep of the spillway policy against
// Starburst's linear_cost over its waiting budget, in one run.
type SweepResult struct {
	Points []SweepPoint    `json:"points"`
	Checks []FrontierCheck `json:"checks"`
	// AllAtOrBelow reports whether every check of the threshold/minWait
	// family holds, CostWaitAllAtOrBelow the same for the costWait family,
	// AnyAtOrBelow for both together.
	AllAtOrBelow         bool `json:"allAtOrBelow"`
	CostWaitAllAtOrBelow bool `json:"costWaitAllAtOrBelow"`
	AnyAtOrBelow         bool `json:"anyAtOrBelow"`
}

// Sweep grids: spillway's threshold × minimum wait, then minimum waits
// with a longer one for the queue of large jobs (high_perf in the
// standard scenario), against Starburst's linear_cost over its waiting
// budget.
var (
	sweepThresholds = []string{"0.8", "1"}
	sweepMinWaits   = []string{"2m", "15m", "1h", "4h"}
	sweepLargeWaits = [][2]string{{"15m", "4h"}, {"1h", "8h"}, {"4h", "16h"}}
	sweepBudgets    = []string{"0.1", "0.25", "0.5", "1"}
	// costWait runs at threshold 1 (burst only once every owned GPU is
	// taken), which the replays found cheaper at equal JCT than 0.8, over
	// a finer grid of β than Starburst's.
	sweepCostWaits = []string{"0.05", "0.1", "0.15", "0.25", "0.35", "0.5", "0.7", "1"}
)

// SweepLargeQueue is the queue the sweep gives longer minimum waits.
const SweepLargeQueue = "high_perf"

// SweepPolicies is the sweep's grid.
func SweepPolicies(c *Cluster) ([]Policy, error) {
	var names []string
	for _, th := range sweepThresholds {
		for _, mw := range sweepMinWaits {
			names = append(names, fmt.Sprintf("%s:threshold=%s:minWait=%s", PolicySpillway, th, mw))
		}
	}
	if slices.Contains(queueNames(c), SweepLargeQueue) {
		for _, w := range sweepLargeWaits {
			names = append(names, fmt.Sprintf("%s:minWait=%s:%s.minWait=%s", PolicySpillway, w[0], SweepLargeQueue, w[1]))
		}
	}
	for _, b := range sweepCostWaits {
		names = append(names, fmt.Sprintf("%s:threshold=1:costWait=%s", PolicySpillway, b))
	}
	for _, b := range sweepBudgets {
		names = append(names, fmt.Sprintf("%s:budget=%s", PolicyStarburstCost, b))
	}
	out := make([]Policy, 0, len(names))
	for _, n := range names {
		p, err := ParsePolicy(n, c)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Sweep runs the sweep grid and compares the frontiers.
func Sweep(tr *Trace, c *Cluster, opt Options) (*SweepResult, error) {
	pols, err := SweepPolicies(c)
	if err != nil {
		return nil, err
	}
	res, err := RunAll(tr, c, pols, opt)
	if err != nil {
		return nil, err
	}
	return Frontier(res), nil
}

// familyOf sorts a result into its sweep family.
func familyOf(r *Result) string {
	switch {
	case strings.HasPrefix(r.Policy, PolicyStarburstCost):
		return FamilyStarburst
	case r.WaitPerGPUHour > 0:
		return FamilyCostWait
	}
	return FamilySpillway
}

// Frontier turns sweep results into points and checks: for every
// starburst-linear-cost point and each spillway family, the cheapest
// point of the family whose mean JCT is no longer must cost no more.
func Frontier(results []*Result) *SweepResult {
	out := &SweepResult{AllAtOrBelow: true, CostWaitAllAtOrBelow: true, AnyAtOrBelow: true}
	for _, r := range results {
		out.Points = append(out.Points, SweepPoint{Policy: r.Policy, Family: familyOf(r), MeanJCT: r.JCT.Mean,
			P95Wait: r.Wait.P95, Cost: money(r.BurstCost), BurstGPUHours: r.BurstGPUHours, WaitPerGPUHour: r.WaitPerGPUHour})
	}
	byJCT := func(a, b SweepPoint) int {
		if c := cmp.Compare(a.MeanJCT, b.MeanJCT); c != 0 {
			return c
		}
		return cmp.Compare(a.Cost, b.Cost)
	}
	slices.SortStableFunc(out.Points, func(a, b SweepPoint) int {
		if c := strings.Compare(a.Family, b.Family); c != 0 {
			return c
		}
		return byJCT(a, b)
	})
	members := map[string][]SweepPoint{} // by family, in JCT order
	for _, p := range out.Points {
		members[p.Family] = append(members[p.Family], p)
		if p.Family != FamilyStarburst {
			members[FamilyAny] = append(members[FamilyAny], p)
		}
	}
	slices.SortStableFunc(members[FamilyAny], byJCT)
	fronts := map[string][]SweepPoint{}
	type member struct{ family, policy string }
	onFront := map[member]bool{}
	for fam, ps := range members {
		for _, p := range ps {
			if f := fronts[fam]; len(f) == 0 || p.Cost < f[len(f)-1].Cost {
				fronts[fam] = append(f, p)
				onFront[member{fam, p.Policy}] = true
			}
		}
	}
	for i := range out.Points {
		p := &out.Points[i]
		p.Frontier = onFront[member{p.Family, p.Policy}]
	}
	for _, fam := range []string{FamilySpillway, FamilyCostWait, FamilyAny} {
		if len(members[fam]) == 0 {
			continue
		}
		for _, s := range members[FamilyStarburst] {
			ch := FrontierCheck{Family: fam, Starburst: s.Policy, MeanJCT: s.MeanJCT, StarburstCost: s.Cost, SpillwayCost: math.Inf(1)}
			if f := frontierAt(fronts[fam], s.MeanJCT); !math.IsNaN(f) && s.Cost > 0 {
				g := f/s.Cost - 1
				ch.Gap = &g
			}
			for _, p := range members[fam] {
				if p.MeanJCT <= s.MeanJCT && p.Cost < ch.SpillwayCost {
					ch.Spillway, ch.SpillwayJCT, ch.SpillwayCost = p.Policy, p.MeanJCT, p.Cost
				}
			}
			if ch.Spillway == "" {
				ch.SpillwayCost = 0
			}
			ch.AtOrBelow = ch.Spillway != "" && ch.SpillwayCost <= s.Cost
			switch fam {
			case FamilySpillway:
				out.AllAtOrBelow = out.AllAtOrBelow && ch.AtOrBelow
			case FamilyCostWait:
				out.CostWaitAllAtOrBelow = out.CostWaitAllAtOrBelow && ch.AtOrBelow
			default:
				out.AnyAtOrBelow = out.AnyAtOrBelow && ch.AtOrBelow
			}
			out.Checks = append(out.Checks, ch)
		}
	}
	return out
}

// frontierAt is the cost of the frontier (points by increasing JCT and
// decreasing cost) at JCT x, on the straight line between its two
// neighbours; NaN outside its range.
func frontierAt(front []SweepPoint, x float64) float64 {
	for i := range front {
		p := front[i]
		if p.MeanJCT == x {
			return p.Cost
		}
		if i > 0 && front[i-1].MeanJCT < x && x < p.MeanJCT {
			a := front[i-1]
			return a.Cost + (p.Cost-a.Cost)*(x-a.MeanJCT)/(p.MeanJCT-a.MeanJCT)
		}
	}
	return math.NaN()
}

// WriteTable prints the sweep.
func (s *SweepResult) WriteTable(w io.Writer, currency string) error {
	fmt.Fprintf(w, "cost-versus-JCT sweep (* on the family's frontier):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tJCT mean\twait p95\tburst GPU-h\tcost %s\t\t\n", currency)
	for _, p := range s.Points {
		mark := ""
		if p.Frontier {
			mark = "*"
		}
		name := p.Policy
		if p.WaitPerGPUHour > 0 {
			name += fmt.Sprintf(" (waitPerGPUHour %s)", p.WaitPerGPUHour)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.0f\t%s\t\n", name, human(p.MeanJCT), human(p.P95Wait), p.BurstGPUHours, p.Cost, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\neach spillway family against starburst-linear-cost at each of its JCTs (gap: the family's frontier at that JCT against starburst's cost):\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "family\tstarburst\tJCT mean\tcost\tcheapest no slower\tJCT mean\tcost\tat or below\tgap")
	hours := func(sec float64) string { return fmt.Sprintf("%.2fh", sec/3600) }
	for _, c := range s.Checks {
		sp, jct, cost, gap := "none", "-", "-", "-"
		if c.Spillway != "" {
			sp, jct, cost = c.Spillway, hours(c.SpillwayJCT), fmt.Sprintf("%.0f", c.SpillwayCost)
		}
		if c.Gap != nil {
			gap = fmt.Sprintf("%+.1f%%", 100**c.Gap)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%v\t%s\n", c.Family, c.Starburst, hours(c.MeanJCT), c.StarburstCost, sp, jct, cost, c.AtOrBelow, gap)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "spillway with thresholds and minimum waits at or below starburst-linear-cost at every JCT: %v\n", s.AllAtOrBelow)
	fmt.Fprintf(w, "spillway with waitPerGPUHour (costWait) at or below at every JCT: %v\n", s.CostWaitAllAtOrBelow)
	fmt.Fprintf(w, "spillway, any configuration of the sweep, at or below at every JCT: %v\n", s.AnyAtOrBelow)
	return nil
}
