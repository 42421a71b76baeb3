package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// Wait kinds: Starburst's waiting policies (Luo et al., ATC'24). Each
// gives job j a maximum wait w_j in the on-prem queue, after which it
// goes to the cloud; docs/sim.md has the formulas.
const (
	WaitZero          = "zero"
	WaitConstant      = "constant"
	WaitLinearRuntime = "linear_runtime"
	WaitLinearCost    = "linear_cost"
	// WaitDeclaredCost is linear_cost with what the broker knows: each
	// job's declared timeout instead of its true run time
	// ("spillway:costWait=β").
	WaitDeclaredCost = "declared_cost"
)

// WaitRule gives every job its own minimum wait before bursting.
type WaitRule struct {
	// Kind is one of the Wait* constants; empty means none (the burst
	// policy's and queues' minimum waits apply).
	Kind string `json:"kind,omitempty"`
	// Budget is Starburst's waiting budget β: the waits sum to β × the
	// sum of the jobs' run times.
	Budget float64 `json:"budget,omitempty"`
}

// Policy is one configuration of the burst decision. Every policy runs
// the same scheduler core and the same burst.Decide; they differ only in
// the burst.Policy they pass, whether any provider exists, and per-job
// minimum waits.
type Policy struct {
	// Name is how the policy was asked for ("spillway",
	// "spillway:threshold=0.9:minWait=5m", "starburst-linear-cost").
	Name  string       `json:"name"`
	Burst burst.Policy `json:"burst"`
	// NoOffers means no provider: like a broker without providers, the
	// burst controller never runs and everything stays on-prem.
	NoOffers bool `json:"noOffers,omitempty"`
	// Wait gives each job its own minimum wait (Starburst).
	Wait WaitRule `json:"wait,omitempty"`
}

// Policy names.
const (
	PolicyNoBurst         = "no-burst"
	PolicyAnyPending      = "burst-any-pending"
	PolicySpillway        = "spillway"
	PolicyStarburstZero   = "starburst-zero"
	PolicyStarburstConst  = "starburst-constant"
	PolicyStarburstRun    = "starburst-linear-runtime"
	PolicyStarburstCost   = "starburst-linear-cost"
	defaultPolicyList     = PolicyNoBurst + "," + PolicyAnyPending + "," + PolicySpillway + "," + PolicyStarburstZero + "," + PolicyStarburstConst + "," + PolicyStarburstRun + "," + PolicyStarburstCost
	policyParamSeparator  = ":"
	policyAssignSeparator = "="
)

// AllPolicies is every named policy, comma-separated: --policy's default.
const AllPolicies = defaultPolicyList

// ParsePolicies reads a comma-separated list of policies. Each is a name,
// optionally followed by ":key=value" overrides: threshold, hysteresis,
// minWait, waitTarget (every queue), idleTTL, maxInFlight, budget (β of a
// Starburst policy), costWait (β of a per-job minimum wait in proportion
// to GPUs × declared timeout, on any policy: waitPerGPUHour calibrated on
// the trace), waitPerGPUHour (the broker's setting), and QUEUE.minWait,
// QUEUE.waitTarget, QUEUE.threshold for one queue
// ("spillway:high_perf.minWait=1h").
func ParsePolicies(list string, c *Cluster) ([]Policy, error) {
	var out []Policy
	seen := map[string]bool{}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if seen[item] {
			return nil, fmt.Errorf("policy %q is listed twice", item)
		}
		seen[item] = true
		p, err := ParsePolicy(item, c)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policy given (known: %s)", AllPolicies)
	}
	return out, nil
}

// ParsePolicy reads one policy (see ParsePolicies).
func ParsePolicy(item string, c *Cluster) (Policy, error) {
	parts := strings.Split(item, policyParamSeparator)
	p, err := NamedPolicy(parts[0], c)
	if err != nil {
		return Policy{}, err
	}
	p.Name = item
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, policyAssignSeparator)
		if !ok {
			return Policy{}, fmt.Errorf("policy %s: %q is not key=value", item, kv)
		}
		if err := p.set(k, v, queueNames(c)); err != nil {
			return Policy{}, fmt.Errorf("policy %s: %s: %w", item, k, err)
		}
	}
	return p, nil
}

// NamedPolicy returns a named policy on cluster c:
//
//   - no-burst: the burst decision gets no offers, so everything stays
//     on-prem.
//   - burst-any-pending: threshold 0, no hysteresis, no minimum wait, no
//     per-queue overrides: launch for anything that waits (Karpenter, or
//     Slurm's power saving).
//   - spillway: the cluster config's burst section as written.
//   - starburst-zero, -constant, -linear-runtime, -linear-cost: threshold
//     0, no hysteresis, no per-queue overrides, and each job's minimum
//     wait from Starburst's waiting policy with the config's waiting
//     budget. starburst-zero is burst-any-pending under another name.
func NamedPolicy(name string, c *Cluster) (Policy, error) {
	p := Policy{Name: name, Burst: c.Burst}
	anyPending := func() {
		p.Burst.Threshold, p.Burst.Hysteresis, p.Burst.MinWait, p.Burst.Queues = 0, 0, 0, nil
		p.Burst.SpillBack = burst.SpillBackPolicy{} // the reference algorithms never move work home
	}
	switch name {
	case PolicyNoBurst:
		p.NoOffers = true
	case PolicyAnyPending:
		anyPending()
	case PolicySpillway:
	case PolicyStarburstZero:
		anyPending()
		p.Wait = WaitRule{Kind: WaitZero}
	case PolicyStarburstConst:
		anyPending()
		p.Wait = WaitRule{Kind: WaitConstant, Budget: c.WaitingBudget}
	case PolicyStarburstRun:
		anyPending()
		p.Wait = WaitRule{Kind: WaitLinearRuntime, Budget: c.WaitingBudget}
	case PolicyStarburstCost:
		anyPending()
		p.Wait = WaitRule{Kind: WaitLinearCost, Budget: c.WaitingBudget}
	default:
		return Policy{}, fmt.Errorf("unknown policy %q (known: %s)", name, AllPolicies)
	}
	return p, nil
}

func (p *Policy) set(k, v string, queues []string) error {
	num := func(lo, hi float64) (float64, error) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < lo || f > hi {
			return 0, fmt.Errorf("%q is not a number between %g and %g", v, lo, hi)
		}
		return f, nil
	}
	dur := func() (time.Duration, error) { return broker.ParseDuration(v) }
	var err error
	switch k {
	case "threshold":
		p.Burst.Threshold, err = num(0, 1)
		p.Burst.Hysteresis = min(p.Burst.Hysteresis, p.Burst.Threshold)
	case "hysteresis":
		p.Burst.Hysteresis, err = num(0, p.Burst.Threshold)
	case "minWait":
		p.Burst.MinWait, err = dur()
	case "idleTTL":
		p.Burst.IdleTTL, err = dur()
	case "maxInFlight":
		var f float64
		f, err = num(1, 1e6)
		p.Burst.MaxInFlight = int(f)
		p.Burst.MaxInFlightPerProvider = int(f)
	case "waitTarget":
		var d time.Duration
		d, err = dur()
		for _, name := range queues {
			p.setQueue(name, func(q *burst.QueuePolicy) { q.WaitTarget = d })
		}
	case "costWait":
		p.Wait = WaitRule{Kind: WaitDeclaredCost}
		p.Wait.Budget, err = num(0, 100)
	case "waitPerGPUHour":
		p.Burst.WaitPerGPUHour, err = dur()
	case "maxWait":
		p.Burst.MaxWait, err = dur()
	case "maxWaitMultiNode":
		p.Burst.MaxWaitMultiNode, err = dur()
	case "budget":
		if p.Wait.Kind == "" || p.Wait.Kind == WaitZero {
			return fmt.Errorf("only the starburst constant, linear-runtime and linear-cost policies have a waiting budget")
		}
		p.Wait.Budget, err = num(0, 100)
	default:
		queue, field, ok := strings.Cut(k, ".")
		if !ok || !slices.Contains(queues, queue) {
			return fmt.Errorf("unknown key (known: threshold, hysteresis, minWait, waitTarget, idleTTL, maxInFlight, budget, costWait, waitPerGPUHour, maxWait, maxWaitMultiNode, QUEUE.minWait, QUEUE.waitTarget, QUEUE.threshold)")
		}
		switch field {
		case "minWait", "waitTarget":
			var d time.Duration
			if d, err = dur(); err == nil {
				p.setQueue(queue, func(q *burst.QueuePolicy) {
					if field == "minWait" {
						q.MinWait = d
					} else {
						q.WaitTarget = d
					}
				})
			}
		case "threshold":
			var f float64
			if f, err = num(0, 1); err == nil {
				p.setQueue(queue, func(q *burst.QueuePolicy) { q.Threshold = f })
			}
		default:
			return fmt.Errorf("unknown queue key %q (known: minWait, waitTarget, threshold)", field)
		}
	}
	return err
}

// setQueue changes one queue's override, on a copy of the map (policies
// derived from one cluster share its maps).
func (p *Policy) setQueue(name string, f func(*burst.QueuePolicy)) {
	qs := make(map[string]burst.QueuePolicy, len(p.Burst.Queues)+1)
	for n, q := range p.Burst.Queues {
		qs[n] = q
	}
	q := qs[name]
	f(&q)
	qs[name] = q
	p.Burst.Queues = qs
}

// queueNames are the cluster's queues.
func queueNames(c *Cluster) []string {
	var out []string
	for _, q := range c.Config.Queues {
		out = append(out, q.Name)
	}
	return out
}

// jobWaits computes each job's minimum wait under Starburst rule w, by job
// id, over the jobs of the replay: the Starburst formulas with their
// coefficient chosen so that the waits sum to Budget × Σ run time. They
// use each job's true run time, which only a simulator knows; costWait
// (WaitDeclaredCost) is the broker's burst.waitPerGPUHour instead (see
// DeclaredCostRate) and gives no per-job waits here.
func jobWaits(w WaitRule, jobs []Job) map[string]time.Duration {
	if w.Kind == "" || w.Kind == WaitZero || w.Kind == WaitDeclaredCost || len(jobs) == 0 {
		return nil
	}
	var sumRun, sumCost float64
	for _, j := range jobs {
		r := j.Duration.Seconds()
		sumRun += r
		sumCost += float64(j.GPUs) * r
	}
	out := make(map[string]time.Duration, len(jobs))
	for _, j := range jobs {
		r := j.Duration.Seconds()
		var wait float64
		switch w.Kind {
		case WaitConstant:
			wait = w.Budget * sumRun / float64(len(jobs))
		case WaitLinearRuntime:
			wait = w.Budget * r
		case WaitLinearCost:
			wait = w.Budget * sumRun / sumCost * float64(j.GPUs) * r
		}
		out[j.ID] = time.Duration(wait * float64(time.Second))
	}
	return out
}

// DeclaredCostRate is the burst.waitPerGPUHour that makes the jobs' waits
// (rate × GPUs × declared timeout) sum to β × their declared run time:
// Starburst's linear_cost waiting budget on what the broker knows. The
// sweep prints it so that an operator can put it in the config.
func DeclaredCostRate(beta float64, jobs []Job) time.Duration {
	var sumRun, sumCost float64
	for _, j := range jobs {
		r := DeclaredTimeout(j.Duration).Seconds()
		sumRun += r
		sumCost += float64(j.GPUs) * r
	}
	if sumCost == 0 {
		return 0
	}
	return time.Duration(beta * sumRun / sumCost * float64(time.Hour)).Round(time.Millisecond)
}
