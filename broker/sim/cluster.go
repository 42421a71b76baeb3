package sim

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/providers"
)

// ClusterFile is the simulator's cluster config as written in YAML
// (docs/sim.md; deploy/sim/cluster.yaml is the standard scenario).
type ClusterFile struct {
	// Broker is a broker config (docs/config.md): the simulator reads its
	// scheduler, queues, priorities, teams, billing and burst policy
	// through package config, the broker's own reader.
	Broker json.RawMessage `json:"broker,omitempty"`
	// Nodes are the on-prem node groups.
	Nodes []NodeGroup `json:"nodes"`
	// Burst is how the simulated providers behave.
	Burst BurstFile `json:"burst,omitempty"`
	// Offers are what the simulated providers can launch.
	Offers []OfferFile `json:"offers,omitempty"`
	// Currency of every price and budget; USD when empty.
	Currency string `json:"currency,omitempty"`
	// Budgets are monthly burst budgets.
	Budgets BudgetFile `json:"budgets,omitempty"`
	// Overhead says who pays for idle and booting burst GPUs: account
	// (the default, the burst-overhead account) or demand-team.
	Overhead string `json:"overhead,omitempty"`
	// Jobs says how trace rows become job specs.
	Jobs JobsFile `json:"jobs,omitempty"`
	// Starburst configures the Starburst waiting policies.
	Starburst StarburstFile `json:"starburst,omitempty"`
}

// NodeGroup is Count identical on-prem nodes.
type NodeGroup struct {
	// Name prefixes the node names: <name>-000, <name>-001, …
	Name   string          `json:"name"`
	Count  int             `json:"count"`
	GPUs   int             `json:"gpus"`
	Model  string          `json:"model"`
	Memory broker.Quantity `json:"memory"`
	// Driver is the driver version (gangs need one).
	Driver string            `json:"driver,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// BurstFile is how the simulated providers behave. The burst policy
// itself (threshold, minimum wait, caps, idle TTL, lifetime, per-queue
// overrides, the decision interval) is the broker config's burst section.
type BurstFile struct {
	// LeadTime is from launch to a registered agent, for offers that do
	// not set their own.
	LeadTime LeadTime `json:"leadTime,omitempty"`
	// CapacityFailureRate is the chance that one create call fails for
	// lack of capacity (0..1); the launch then tries the next offer.
	CapacityFailureRate float64 `json:"capacityFailureRate,omitempty"`
}

// LeadTime is a log-normal distribution of launch lead times, fitted to
// its median and 99th percentile and cut at Max.
type LeadTime struct {
	P50 broker.Duration `json:"p50,omitempty"`
	P99 broker.Duration `json:"p99,omitempty"`
	Max broker.Duration `json:"max,omitempty"`
}

// OfferFile is one offer of a simulated provider.
type OfferFile struct {
	Provider     string          `json:"provider"`
	Region       string          `json:"region,omitempty"`
	InstanceType string          `json:"instanceType"`
	GPUModel     string          `json:"gpuModel"`
	GPUs         int             `json:"gpus"`
	GPUMemory    broker.Quantity `json:"gpuMemory,omitempty"`
	Spot         bool            `json:"spot,omitempty"`
	PricePerHour billing.Amount  `json:"pricePerHour"`
	Prepaid      bool            `json:"prepaid,omitempty"`
	// Source says where the price comes from (documentation only).
	Source   string    `json:"source,omitempty"`
	LeadTime *LeadTime `json:"leadTime,omitempty"`
	// ReclaimsPerHour is how often the provider takes a spot machine of
	// this offer back: each machine's time to a reclaim notice is drawn
	// from an exponential distribution of this rate, from its launch
	// (spot offers only; 0, the default, never).
	ReclaimsPerHour float64 `json:"reclaimsPerHour,omitempty"`
	// ReclaimNotice is the time from the notice to the reclaim (default
	// 2m, as AWS gives).
	ReclaimNotice broker.Duration `json:"reclaimNotice,omitempty"`
}

// Reclaims is how a spot offer's machines are taken back.
type Reclaims struct {
	PerHour float64
	Notice  time.Duration
}

// BudgetFile is the monthly burst budget, globally and per team.
type BudgetFile struct {
	Global *billing.Amount           `json:"global,omitempty"`
	Teams  map[string]billing.Amount `json:"teams,omitempty"`
}

// JobsFile is how trace rows become job specs.
type JobsFile struct {
	// Preemptible lists the priority classes whose jobs are preemptible
	// (default: low).
	Preemptible []string `json:"preemptible,omitempty"`
	// CheckpointGrace is the grace a preempted job gets (default 30s).
	CheckpointGrace broker.Duration `json:"checkpointGrace,omitempty"`
	// CheckpointTime is how long a simulated job takes to save its work
	// and exit after the checkpoint signal (default 10s, at most the
	// grace). Its work up to the signal is kept.
	CheckpointTime broker.Duration `json:"checkpointTime,omitempty"`
	// CheckpointInterval is how often simulated jobs declare they save a
	// checkpoint (checkpoint.interval, default 30m); spill-back counts
	// it as the most work a move can lose. Every simulated job keeps its
	// checkpoint in object storage (checkpoint.to), so any may move.
	CheckpointInterval broker.Duration `json:"checkpointInterval,omitempty"`
}

// StarburstFile configures the Starburst waiting policies.
type StarburstFile struct {
	// WaitingBudget is β: the policies' waits sum to β × the sum of the
	// jobs' run times over the replayed trace (default 0.25).
	WaitingBudget float64 `json:"waitingBudget,omitempty"`
}

// Cluster is a checked cluster config, ready to simulate.
type Cluster struct {
	// Config is the broker config of the cluster file's broker section.
	Config *config.Config
	// Groups are the on-prem node groups.
	Groups []NodeGroup
	// Burst is the spillway policy: the broker config's burst section.
	Burst burst.Policy
	// LeadTime is the default lead time; OfferLead each offer's, by key.
	LeadTime  LeadTime
	OfferLead map[string]LeadTime
	// Reclaims are the spot offers' reclaim rates, by offer key (offers
	// without reclaims are absent).
	Reclaims map[string]Reclaims
	// Offers are the simulated providers' offers, all available.
	Offers []providers.Offer
	// CapacityFailureRate is the chance a create call fails for capacity.
	CapacityFailureRate float64
	Currency            string
	// Budgets are monthly limits by scope (broker.GlobalScope, teams).
	Budgets  map[string]billing.Amount
	Overhead billing.OverheadPolicy
	// Preemptible are the priority classes whose jobs are preemptible.
	Preemptible map[string]bool
	// CheckpointGrace is the grace stopped jobs get; CheckpointTime how
	// long a simulated job takes to save and exit.
	CheckpointGrace time.Duration
	CheckpointTime  time.Duration
	// CheckpointInterval is the jobs' declared checkpoint interval.
	CheckpointInterval time.Duration
	// WaitingBudget is the Starburst policies' β.
	WaitingBudget float64
}

// LoadCluster reads and checks a cluster config file.
func LoadCluster(path string) (*Cluster, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster config: %w", err)
	}
	c, err := ParseCluster(raw)
	if err != nil {
		return nil, fmt.Errorf("cluster config %s: %w", path, err)
	}
	return c, nil
}

// ParseCluster reads a cluster config, applies defaults and checks it;
// a problem names its field.
func ParseCluster(raw []byte) (*Cluster, error) {
	var f ClusterFile
	if err := broker.DecodeStrict(raw, &f); err != nil {
		return nil, err
	}
	ve := &broker.ValidationError{}
	add := func(field, code, format string, args ...any) {
		ve.Errors = append(ve.Errors, broker.FieldError{Field: field, Code: code, Message: fmt.Sprintf(format, args...)})
	}
	brokerDoc := []byte(f.Broker)
	if len(brokerDoc) == 0 || string(brokerDoc) == "null" {
		brokerDoc = []byte("{}")
	}
	cfg, err := config.Parse(brokerDoc)
	if err != nil {
		var bve *broker.ValidationError
		if !errors.As(err, &bve) {
			return nil, fmt.Errorf("broker: %w", err)
		}
		for _, fe := range bve.Errors {
			fe.Field = join("broker", fe.Field)
			ve.Errors = append(ve.Errors, fe)
		}
	}
	c := &Cluster{Config: cfg, Groups: f.Nodes, Currency: f.Currency, OfferLead: map[string]LeadTime{}, Reclaims: map[string]Reclaims{},
		Budgets: map[string]billing.Amount{}, Preemptible: map[string]bool{}}
	if c.Currency == "" {
		c.Currency = "USD"
	}
	if len(c.Currency) != 3 {
		add("currency", broker.CodeInvalid, "must be an ISO 4217 code like USD")
	}

	if len(f.Nodes) == 0 {
		add("nodes", broker.CodeRequired, "list at least one node group")
	}
	names := map[string]bool{}
	for i, g := range f.Nodes {
		p := fmt.Sprintf("nodes[%d]", i)
		if !nameRe.MatchString(g.Name) || len(g.Name) > 40 {
			add(p+".name", broker.CodeInvalid, "must be 1-40 letters, digits, '.', '_' or '-'")
		} else if names[g.Name] {
			add(p+".name", broker.CodeInvalid, "duplicate node group %q", g.Name)
		}
		names[g.Name] = true
		if g.Count < 1 || g.Count > 100_000 {
			add(p+".count", broker.CodeOutOfRange, "must be between 1 and 100000, got %d", g.Count)
		}
		if g.GPUs < 1 || g.GPUs > 64 {
			add(p+".gpus", broker.CodeOutOfRange, "must be between 1 and 64, got %d", g.GPUs)
		}
		if g.Model == "" {
			add(p+".model", broker.CodeRequired, "is required, e.g. \"NVIDIA Tesla P100-PCIE-16GB\"")
		}
		if g.Memory <= 0 {
			add(p+".memory", broker.CodeRequired, "is required: the memory of one card, e.g. 16Gi")
		}
	}

	bf := f.Burst
	if cfg != nil {
		c.Burst = cfg.BurstPolicy()
	}
	c.LeadTime = leadDefaults(bf.LeadTime, LeadTime{P50: broker.Duration(2 * time.Minute), P99: broker.Duration(25 * time.Minute), Max: broker.Duration(30 * time.Minute)})
	checkLead(add, "burst.leadTime", c.LeadTime)
	c.CapacityFailureRate = bf.CapacityFailureRate
	if c.CapacityFailureRate < 0 || c.CapacityFailureRate >= 1 {
		add("burst.capacityFailureRate", broker.CodeOutOfRange, "must be at least 0 and below 1, got %g", c.CapacityFailureRate)
	}

	keys := map[string]bool{}
	for i, o := range f.Offers {
		p := fmt.Sprintf("offers[%d]", i)
		off := providers.Offer{Provider: o.Provider, Region: o.Region, InstanceType: o.InstanceType, GPUModel: o.GPUModel,
			GPUs: o.GPUs, GPUMemoryBytes: int64(o.GPUMemory), Spot: o.Spot, PricePerHour: o.PricePerHour,
			Currency: c.Currency, Prepaid: o.Prepaid, Available: true}
		if !nameRe.MatchString(o.Provider) {
			add(p+".provider", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
		}
		if o.InstanceType == "" {
			add(p+".instanceType", broker.CodeRequired, "is required")
		}
		if o.GPUModel == "" {
			add(p+".gpuModel", broker.CodeRequired, "is required")
		}
		if o.GPUs < 1 || o.GPUs > 64 {
			add(p+".gpus", broker.CodeOutOfRange, "must be between 1 and 64, got %d", o.GPUs)
		}
		if o.PricePerHour < 0 {
			add(p+".pricePerHour", broker.CodeOutOfRange, "must not be negative")
		}
		if keys[off.Key()] {
			add(p, broker.CodeInvalid, "duplicate offer %s", off.Key())
		}
		keys[off.Key()] = true
		lt := c.LeadTime
		if o.LeadTime != nil {
			lt = leadDefaults(*o.LeadTime, c.LeadTime)
			checkLead(add, p+".leadTime", lt)
		}
		c.OfferLead[off.Key()] = lt
		switch {
		case math.IsNaN(o.ReclaimsPerHour) || o.ReclaimsPerHour < 0 || o.ReclaimsPerHour > 60:
			add(p+".reclaimsPerHour", broker.CodeOutOfRange, "must be between 0 and 60, got %g", o.ReclaimsPerHour)
		case o.ReclaimsPerHour > 0 && !o.Spot:
			add(p+".reclaimsPerHour", broker.CodeInvalid, "only spot offers are reclaimed: set spot: true or remove it")
		case o.ReclaimNotice != 0 && o.ReclaimsPerHour == 0:
			add(p+".reclaimNotice", broker.CodeInvalid, "needs reclaimsPerHour above 0")
		case o.ReclaimNotice < 0 || o.ReclaimNotice.D() > time.Hour:
			add(p+".reclaimNotice", broker.CodeOutOfRange, "must be between 0 and 1h, got %s", o.ReclaimNotice)
		case o.ReclaimsPerHour > 0:
			c.Reclaims[off.Key()] = Reclaims{PerHour: o.ReclaimsPerHour, Notice: cmp.Or(o.ReclaimNotice.D(), 2*time.Minute)}
		}
		c.Offers = append(c.Offers, off)
	}

	if f.Budgets.Global != nil {
		c.Budgets[broker.GlobalScope] = *f.Budgets.Global
	}
	for team, a := range f.Budgets.Teams {
		c.Budgets[team] = a
	}
	for _, scope := range sortedKeys(c.Budgets) {
		if c.Budgets[scope] < 0 {
			add("budgets."+scope, broker.CodeOutOfRange, "must not be negative")
		}
	}
	switch f.Overhead {
	case "", string(billing.ChargeAccount):
		c.Overhead = billing.OverheadPolicy{ChargeTo: billing.ChargeAccount}
	case string(billing.ChargeDemandTeam):
		c.Overhead = billing.OverheadPolicy{ChargeTo: billing.ChargeDemandTeam}
	default:
		add("overhead", broker.CodeInvalid, "must be account or demand-team, got %q", f.Overhead)
	}

	pre := f.Jobs.Preemptible
	if pre == nil {
		pre = []string{"low"}
	}
	for _, p := range pre {
		if cfg != nil && cfg.PriorityValue(p) == 0 && !slices.ContainsFunc(cfg.Priorities, func(x config.Priority) bool { return x.Name == p }) {
			add("jobs.preemptible", broker.CodeInvalid, "no priority %q in broker.priorities", p)
		}
		c.Preemptible[p] = true
	}
	c.CheckpointGrace = f.Jobs.CheckpointGrace.D()
	if c.CheckpointGrace == 0 {
		c.CheckpointGrace = 30 * time.Second
	}
	c.CheckpointTime = f.Jobs.CheckpointTime.D()
	if c.CheckpointTime == 0 {
		c.CheckpointTime = 10 * time.Second
	}
	c.CheckpointTime = min(c.CheckpointTime, c.CheckpointGrace)
	c.CheckpointInterval = cmp.Or(f.Jobs.CheckpointInterval.D(), 30*time.Minute)
	if c.CheckpointInterval < 0 || c.CheckpointInterval > 7*24*time.Hour {
		add("jobs.checkpointInterval", broker.CodeOutOfRange, "must be between 0 and 7d")
	}
	if c.CheckpointGrace > time.Hour {
		add("jobs.checkpointGrace", broker.CodeOutOfRange, "must be at most 1h")
	}
	c.WaitingBudget = f.Starburst.WaitingBudget
	if c.WaitingBudget == 0 {
		c.WaitingBudget = 0.25
	}
	if c.WaitingBudget < 0 || c.WaitingBudget > 100 || math.IsNaN(c.WaitingBudget) {
		add("starburst.waitingBudget", broker.CodeOutOfRange, "must be between 0 and 100, got %g", c.WaitingBudget)
	}
	if len(ve.Errors) > 0 {
		return nil, ve
	}
	return c, nil
}

func leadDefaults(l, d LeadTime) LeadTime {
	if l.P50 == 0 {
		l.P50 = d.P50
	}
	if l.P99 == 0 {
		l.P99 = max(d.P99, l.P50)
	}
	if l.Max == 0 {
		l.Max = max(d.Max, l.P99)
	}
	return l
}

func checkLead(add func(field, code, format string, args ...any), p string, l LeadTime) {
	if l.P50 <= 0 || l.P99 < l.P50 || l.Max < l.P50 {
		add(p, broker.CodeOutOfRange, "needs 0 < p50 ≤ p99 and p50 ≤ max, got p50 %s, p99 %s, max %s", l.P50, l.P99, l.Max)
	}
}

// OnPremGPUs is the number of on-prem GPUs.
func (c *Cluster) OnPremGPUs() int {
	n := 0
	for _, g := range c.Groups {
		n += g.Count * g.GPUs
	}
	return n
}

// LargestNode is the most GPUs any on-prem node has.
func (c *Cluster) LargestNode() int {
	n := 0
	for _, g := range c.Groups {
		n = max(n, g.GPUs)
	}
	return n
}

// nodes builds the on-prem nodes, ready, registered at t.
func (c *Cluster) nodes(t time.Time) []*broker.Node {
	var out []*broker.Node
	for _, g := range c.Groups {
		for i := 0; i < g.Count; i++ {
			name := fmt.Sprintf("%s-%03d", g.Name, i)
			out = append(out, simNode(name, "onprem", "", g.GPUs, g.Model, int64(g.Memory), g.Driver, g.Labels, t))
		}
	}
	return out
}

func simNode(name, pool, instance string, gpus int, model string, mem int64, driver string, labels map[string]string, t time.Time) *broker.Node {
	n := &broker.Node{Name: name, Pool: pool, Instance: instance, State: broker.NodeReady, Labels: labels,
		RegisteredAt: t, LastSeen: t, Inventory: gpu.Inventory{Backend: "sim", DriverVersion: driver}}
	for k := 0; k < gpus; k++ {
		n.Inventory.Devices = append(n.Inventory.Devices, gpu.Device{Index: k, UUID: fmt.Sprintf("GPU-%s-%d", name, k), Model: model, MemoryBytes: mem})
	}
	return n
}

func join(a, b string) string {
	if b == "" {
		return a
	}
	return a + "." + b
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
