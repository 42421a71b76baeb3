package config

import (
	"cmp"
	"fmt"
	"regexp"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// Burst configures the burst controller (docs/bursting.md).
type Burst struct {
	// Interval between burst decisions.
	Interval broker.Duration `json:"interval,omitempty"`
	// Threshold is the on-prem allocation (0..1] at which waiting work
	// may burst; Hysteresis keeps bursting until allocation falls below
	// Threshold-Hysteresis.
	Threshold  float64 `json:"threshold,omitempty"`
	Hysteresis float64 `json:"hysteresis,omitempty"`
	// MinWait is how long burst-eligible work waits first.
	MinWait broker.Duration `json:"minWait,omitempty"`
	// WaitPerGPUHour, when set, replaces MinWait with a wait per job of
	// this much per GPU-hour the job declares (GPUs × nodes × timeout).
	WaitPerGPUHour broker.Duration `json:"waitPerGPUHour,omitempty"`
	// MaxWait caps the wait WaitPerGPUHour gives one job (needs it).
	MaxWait broker.Duration `json:"maxWait,omitempty"`
	// MaxWaitMultiNode is MaxWait for multi-node jobs (needs
	// WaitPerGPUHour).
	MaxWaitMultiNode broker.Duration `json:"maxWaitMultiNode,omitempty"`
	// MaxInFlight caps machines starting at once; per provider too.
	MaxInFlight            int `json:"maxInFlight,omitempty"`
	MaxInFlightPerProvider int `json:"maxInFlightPerProvider,omitempty"`
	// IdleTTL ends a machine without jobs; MaxLifetime ends every machine.
	IdleTTL     broker.Duration `json:"idleTTL,omitempty"`
	MaxLifetime broker.Duration `json:"maxLifetime,omitempty"`
	// LeaseMargin drains leased hosts this long before their lease ends.
	LeaseMargin broker.Duration `json:"leaseMargin,omitempty"`
	// Queues override the trigger per queue.
	Queues []BurstQueue `json:"queues,omitempty"`
	// SSHKeyFile is the broker's SSH client key for bootstrapping (an
	// OpenSSH private key); created (ed25519) when missing. Default
	// dataDir/burst_ssh_key.
	SSHKeyFile string `json:"sshKeyFile,omitempty"`
	// AgentGPUs is the GPU backend burst agents use: auto (default), nvml,
	// or sim (simulated cards shaped like the offer, for test clouds).
	AgentGPUs string `json:"agentGPUs,omitempty"`
	// AgentInit is how burst agents start: auto (a systemd unit where the
	// machine has systemd, else a supervised loop) or supervised.
	AgentInit string `json:"agentInit,omitempty"`
	// AgentSudo: auto (sudo when the login is not root) or never.
	AgentSudo string `json:"agentSudo,omitempty"`
	// AgentDataDir is the agent's data dir on the machine.
	AgentDataDir string `json:"agentDataDir,omitempty"`
	// AgentData is the object-store access and input cache of burst
	// agents (docs/data.md); empty: the machine's credential chain (its
	// instance role) and AWS endpoints. The agent's section (staging),
	// read and checked by broker/adapters.
	AgentData *broker.Section `json:"agentData,omitempty"`
	// AgentRuntime is how burst machines' agents run jobs (process or
	// oci, docs/agent.md); ProviderRuntimes overrides it per provider
	// (by provider name). PrePullImages is how many of the queue's
	// most-used images a new machine pulls before its first job. The
	// agent's sections (onprem/runtime), read and checked by
	// broker/adapters.
	AgentRuntime     *broker.Section           `json:"agentRuntime,omitempty"`
	ProviderRuntimes map[string]broker.Section `json:"providerRuntimes,omitempty"`
	PrePullImages    int                       `json:"prePullImages,omitempty"`
	// RemoteDir is where the binary and agent config go on the machine.
	RemoteDir string `json:"remoteDir,omitempty"`
	// Binaries maps "os/arch" to a spillway binary for machines of another
	// platform than the broker's.
	Binaries map[string]string `json:"binaries,omitempty"`
	// ReconcileEvery is how often every provider's machines are compared
	// with the records; OrphanGrace is how long a machine without a record
	// may live before it is deleted.
	ReconcileEvery broker.Duration `json:"reconcileEvery,omitempty"`
	OrphanGrace    broker.Duration `json:"orphanGrace,omitempty"`
	// OfferCoolDown keeps an offer out of burst decisions this long after
	// the provider refused it (capacity, quota) or reclaimed a spot
	// machine of it; default 15m.
	OfferCoolDown broker.Duration `json:"offerCoolDown,omitempty"`
	// AlertWebhook, when set, receives a JSON POST when a budget crosses
	// 80% and 100%.
	AlertWebhook string `json:"alertWebhook,omitempty"`
	// SpillBack moves checkpointable jobs from burst machines home when
	// owned GPUs stand idle (docs/bursting.md).
	SpillBack SpillBack `json:"spillBack,omitzero"`
}

// SpillBack configures moving jobs home (burst.SpillBackPolicy).
type SpillBack struct {
	Enabled bool `json:"enabled,omitempty"`
	// Margin: move only when the expected saving exceeds the move's cost
	// × (1 + margin). Default 0.5.
	Margin *float64 `json:"margin,omitempty"`
	// MinInterval: never move one job twice within this. Default 1h.
	MinInterval broker.Duration `json:"minInterval,omitempty"`
	// Staging is the expected checkpoint restore time at home. Default 2m.
	Staging broker.Duration `json:"staging,omitempty"`
}

// BurstQueue overrides the trigger for one queue.
type BurstQueue struct {
	Name      string          `json:"name"`
	Threshold float64         `json:"threshold,omitempty"`
	MinWait   broker.Duration `json:"minWait,omitempty"`
	// WaitTarget: work that the scheduler's reservation says would wait
	// longer than this bursts without waiting minWait.
	WaitTarget broker.Duration `json:"waitTarget,omitempty"`
	// Never keeps the queue's work on-prem.
	Never bool `json:"never,omitempty"`
}

// Provider is one entry of `providers:`: exactly one of its fields. Each
// is its adapter's section (providers/aws, gcp, lease, sshpool), kept as
// read: broker/adapters decodes it into the adapter's Config and the
// adapter validates it, so this package imports no adapter.
type Provider struct {
	AWS     *broker.Section `json:"aws,omitempty"`
	GCP     *broker.Section `json:"gcp,omitempty"`
	Lambda  *broker.Section `json:"lambda,omitempty"`
	SSHPool *broker.Section `json:"sshpool,omitempty"`
}

// Kind is the provider's key ("aws", "gcp", "lambda", "sshpool") and its
// section; "" when none or more than one is set.
func (p Provider) Kind() (string, *broker.Section) {
	kind, sec, n := "", (*broker.Section)(nil), 0
	for _, k := range []struct {
		name string
		s    *broker.Section
	}{{"aws", p.AWS}, {"gcp", p.GCP}, {"lambda", p.Lambda}, {"sshpool", p.SSHPool}} {
		if k.s != nil {
			kind, sec, n = k.name, k.s, n+1
		}
	}
	if n != 1 {
		return "", nil
	}
	return kind, sec
}

// Name is the provider's configured name ("" when it leaves the
// adapter's default).
func (p Provider) Name() string {
	if _, sec := p.Kind(); sec != nil {
		return sec.String("name")
	}
	return ""
}

var agentGPUsRe = regexp.MustCompile(`^(auto|nvml|none|sim)$`)

func (c *Config) burstDefaults() {
	d := burst.DefaultPolicy()
	b := &c.Burst
	b.Interval = cmp.Or(b.Interval, broker.Duration(5*time.Second))
	b.Threshold = cmp.Or(b.Threshold, d.Threshold)
	b.Hysteresis = cmp.Or(b.Hysteresis, d.Hysteresis)
	b.MinWait = cmp.Or(b.MinWait, broker.Duration(d.MinWait))
	b.MaxInFlight = cmp.Or(b.MaxInFlight, d.MaxInFlight)
	b.MaxInFlightPerProvider = cmp.Or(b.MaxInFlightPerProvider, d.MaxInFlightPerProvider)
	b.IdleTTL = cmp.Or(b.IdleTTL, broker.Duration(d.IdleTTL))
	b.MaxLifetime = cmp.Or(b.MaxLifetime, broker.Duration(d.MaxLifetime))
	b.LeaseMargin = cmp.Or(b.LeaseMargin, broker.Duration(d.LeaseMargin))
	b.AgentGPUs = cmp.Or(b.AgentGPUs, "auto")
	b.AgentInit = cmp.Or(b.AgentInit, "auto")
	b.AgentSudo = cmp.Or(b.AgentSudo, "auto")
	b.AgentDataDir = cmp.Or(b.AgentDataDir, "/var/lib/spillway")
	b.ReconcileEvery = cmp.Or(b.ReconcileEvery, broker.Duration(time.Minute))
	b.OrphanGrace = cmp.Or(b.OrphanGrace, broker.Duration(2*time.Minute))
	b.OfferCoolDown = cmp.Or(b.OfferCoolDown, broker.Duration(15*time.Minute))
	if b.SpillBack.Margin == nil {
		m := 0.5
		b.SpillBack.Margin = &m
	}
	b.SpillBack.MinInterval = cmp.Or(b.SpillBack.MinInterval, broker.Duration(time.Hour))
	b.SpillBack.Staging = cmp.Or(b.SpillBack.Staging, broker.Duration(2*time.Minute))
}

func (c *Config) validateBurst(add func(field, code, format string, args ...any)) {
	b := c.Burst
	if b.Interval.D() < 10*time.Millisecond {
		add("burst.interval", broker.CodeOutOfRange, "must be at least 10ms")
	}
	if b.Threshold <= 0 || b.Threshold > 1 {
		add("burst.threshold", broker.CodeOutOfRange, "must be in (0, 1], e.g. 0.8")
	}
	if b.Hysteresis < 0 || b.Hysteresis >= b.Threshold {
		add("burst.hysteresis", broker.CodeOutOfRange, "must be at least 0 and below burst.threshold")
	}
	if b.MinWait < 0 {
		add("burst.minWait", broker.CodeOutOfRange, "must not be negative")
	}
	if b.WaitPerGPUHour < 0 || b.WaitPerGPUHour.D() > time.Hour {
		add("burst.waitPerGPUHour", broker.CodeOutOfRange, "must be between 0 and 1h, e.g. 30s")
	}
	for _, c := range []struct {
		field string
		d     broker.Duration
	}{{"burst.maxWait", b.MaxWait}, {"burst.maxWaitMultiNode", b.MaxWaitMultiNode}} {
		field, d := c.field, c.d
		switch {
		case d < 0 || d.D() > 7*24*time.Hour:
			add(field, broker.CodeOutOfRange, "must be between 0 and 7d, e.g. 45m")
		case d > 0 && b.WaitPerGPUHour == 0:
			add(field, broker.CodeInvalid, "caps the wait burst.waitPerGPUHour gives a job; set burst.waitPerGPUHour too")
		}
	}
	if b.MaxInFlight < 1 || b.MaxInFlight > 1000 {
		add("burst.maxInFlight", broker.CodeOutOfRange, "must be between 1 and 1000")
	}
	if b.MaxInFlightPerProvider < 1 || b.MaxInFlightPerProvider > 1000 {
		add("burst.maxInFlightPerProvider", broker.CodeOutOfRange, "must be between 1 and 1000")
	}
	if b.IdleTTL.D() < time.Second {
		add("burst.idleTTL", broker.CodeOutOfRange, "must be at least 1s")
	}
	if b.MaxLifetime.D() < time.Minute {
		add("burst.maxLifetime", broker.CodeOutOfRange, "must be at least 1m")
	}
	if b.LeaseMargin < 0 {
		add("burst.leaseMargin", broker.CodeOutOfRange, "must not be negative")
	}
	if !agentGPUsRe.MatchString(b.AgentGPUs) {
		add("burst.agentGPUs", broker.CodeInvalid, "must be auto, nvml, none or sim")
	}
	if b.AgentInit != "auto" && b.AgentInit != "supervised" {
		add("burst.agentInit", broker.CodeInvalid, "must be auto or supervised")
	}
	if b.AgentSudo != "auto" && b.AgentSudo != "never" {
		add("burst.agentSudo", broker.CodeInvalid, "must be auto or never")
	}
	if b.ReconcileEvery.D() < time.Second {
		add("burst.reconcileEvery", broker.CodeOutOfRange, "must be at least 1s")
	}
	if b.OrphanGrace < 0 {
		add("burst.orphanGrace", broker.CodeOutOfRange, "must not be negative")
	}
	if sb := b.SpillBack; sb.Margin != nil && (*sb.Margin < 0 || *sb.Margin > 100) {
		add("burst.spillBack.margin", broker.CodeOutOfRange, "must be between 0 and 100 (a fraction of the move's cost, e.g. 0.5)")
	}
	if b.SpillBack.MinInterval < 0 {
		add("burst.spillBack.minInterval", broker.CodeOutOfRange, "must not be negative")
	}
	if b.SpillBack.Staging < 0 || b.SpillBack.Staging.D() > 24*time.Hour {
		add("burst.spillBack.staging", broker.CodeOutOfRange, "must be between 0 and 24h")
	}
	for i, q := range b.Queues {
		f := fmt.Sprintf("burst.queues[%d]", i)
		if _, ok := c.Queue(q.Name); !ok {
			add(f+".name", broker.CodeInvalid, "unknown queue %q", q.Name)
		}
		if q.Threshold < 0 || q.Threshold > 1 {
			add(f+".threshold", broker.CodeOutOfRange, "must be in [0, 1]")
		}
		if q.MinWait < 0 || q.WaitTarget < 0 {
			add(f+".minWait", broker.CodeOutOfRange, "must not be negative")
		}
	}
	names := map[string]bool{}
	for i, p := range c.Providers {
		f := fmt.Sprintf("providers[%d]", i)
		if kind, _ := p.Kind(); kind == "" {
			add(f, broker.CodeInvalid, "set exactly one of aws, gcp, lambda, sshpool")
			continue
		}
		name := p.Name()
		if name != "" && names[name] {
			add(f, broker.CodeInvalid, "duplicate provider name %q", name)
		}
		names[name] = true
	}
}

// BurstPolicy is the burst decision's policy from the config.
func (c *Config) BurstPolicy() burst.Policy {
	b := c.Burst
	p := burst.Policy{Threshold: b.Threshold, Hysteresis: b.Hysteresis, MinWait: b.MinWait.D(), WaitPerGPUHour: b.WaitPerGPUHour.D(),
		MaxWait: b.MaxWait.D(), MaxWaitMultiNode: b.MaxWaitMultiNode.D(), MaxInFlight: b.MaxInFlight, MaxInFlightPerProvider: b.MaxInFlightPerProvider,
		IdleTTL: b.IdleTTL.D(), MaxLifetime: b.MaxLifetime.D(), LeaseMargin: b.LeaseMargin.D(),
		Queues: map[string]burst.QueuePolicy{}, Priorities: map[string]int{}}
	if sb := b.SpillBack; sb.Enabled {
		p.SpillBack = burst.SpillBackPolicy{Enabled: true, MinInterval: sb.MinInterval.D(), Staging: sb.Staging.D()}
		if sb.Margin != nil {
			p.SpillBack.Margin = *sb.Margin
		}
	}
	for _, q := range b.Queues {
		p.Queues[q.Name] = burst.QueuePolicy{Threshold: q.Threshold, MinWait: q.MinWait.D(), WaitTarget: q.WaitTarget.D(), Never: q.Never}
	}
	for _, pr := range c.Priorities {
		p.Priorities[pr.Name] = pr.Value
	}
	return p
}
