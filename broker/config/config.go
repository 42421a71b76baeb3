// Package config is the broker's YAML configuration: its fields, their
// defaults and their validation. docs/config.md documents every field and
// deploy/spillway.example.yaml is an annotated example; a test keeps the
// three in step.
package config

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
)

// Config is the whole broker configuration.
type Config struct {
	// Listen is the HTTP address, e.g. "127.0.0.1:8080".
	Listen string `json:"listen"`
	// AdvertiseURL is the URL agents and the CLI use to reach this broker;
	// defaults to http://<listen>.
	AdvertiseURL string `json:"advertiseURL,omitempty"`
	// DataDir holds the embedded store and other local state.
	DataDir string `json:"dataDir"`
	// Store selects the store: "bolt" (the default: DataDir/spillway.db),
	// "bolt:///abs/path.db", or a Redis URL (redis://, rediss://,
	// redis-sentinel://, rediss-sentinel://; see docs/operations.md).
	Store string `json:"store,omitempty"`
	// Cluster names this installation; burst machines carry it as a tag.
	Cluster string `json:"cluster,omitempty"`

	Log        Log        `json:"log,omitempty"`
	Auth       Auth       `json:"auth"`
	Scheduler  Scheduler  `json:"scheduler,omitempty"`
	Queues     []Queue    `json:"queues,omitempty"`
	Priorities []Priority `json:"priorities,omitempty"`
	// Teams sets fair-share weights and quotas per team; a team that is
	// not listed has share 1 and no quota (no guarantee, no limit).
	Teams     []Team      `json:"teams,omitempty"`
	Agents    AgentPolicy `json:"agents,omitempty"`
	Telemetry Telemetry   `json:"telemetry,omitempty"`
	Idle      Idle        `json:"idle,omitempty"`
	// Billing is the ledger's configuration (docs/billing.md).
	Billing billing.Config `json:"billing,omitempty"`
	// Burst configures the burst controller; Providers are where it
	// rents machines (docs/bursting.md, docs/providers.md).
	Burst     Burst      `json:"burst,omitempty"`
	Providers []Provider `json:"providers,omitempty"`
	// HA is the leader election of brokers sharing a Redis store.
	HA HA `json:"ha,omitempty"`
	// Slurm makes the broker a Slurm site's burst provider (broker/slurmdoor,
	// docs/slurm.md); absent when the site runs no Slurm.
	Slurm *Slurm `json:"slurm,omitempty"`

	// billing is Billing checked and compiled by Validate.
	billing billing.Compiled

	// Reports shapes the utilisation and delivery reports (reports.go).
	Reports Reports `json:"reports,omitempty"`

	// TLS, Limits and OIDC are the broker's security settings
	// (security.go, docs/security.md).
	TLS    TLS    `json:"tls,omitempty"`
	Limits Limits `json:"limits,omitempty"`
	OIDC   OIDC   `json:"oidc,omitempty"`
	// Mounts is the allow-list of host paths and volumes a job may mount
	// (docs/jobs.md, "mounts"); anything else is refused at submit.
	Mounts []broker.MountRule `json:"mounts,omitempty"`
}

// HA configures the leader lease that brokers sharing a Redis store hold
// in turn. With the embedded store there is one broker and no election.
type HA struct {
	// BrokerID names this broker in the lease; defaults to
	// <hostname>-<listen port>.
	BrokerID string `json:"brokerID,omitempty"`
	// PeerURL reaches this very broker (not a load balancer): standbys
	// redirect writes to the leader's. Defaults to http://<listen>, with
	// the hostname when listen is on every interface.
	PeerURL string `json:"peerURL,omitempty"`
	// LeaseTTL is how long the lease lasts unrenewed: a dead leader is
	// replaced within LeaseTTL + RenewInterval.
	LeaseTTL broker.Duration `json:"leaseTTL,omitempty"`
	// RenewInterval is how often the leader renews and standbys try to
	// take over; defaults to a third of LeaseTTL.
	RenewInterval broker.Duration `json:"renewInterval,omitempty"`
	// AgentGrace: after a takeover, or after the store comes back from an
	// outage, no node is declared lost before this much time has passed
	// (nor before the usual agents lost timeout).
	AgentGrace broker.Duration `json:"agentGrace,omitempty"`
}

// IsRedis reports whether the store is Redis (and brokers elect a
// leader).
func (c *Config) IsRedis() bool {
	for _, p := range []string{"redis://", "rediss://", "redis-sentinel://", "rediss-sentinel://"} {
		if strings.HasPrefix(c.Store, p) {
			return true
		}
	}
	return false
}

// Log configures log/slog output.
type Log struct {
	Level  string `json:"level,omitempty"`  // debug | info | warn | error
	Format string `json:"format,omitempty"` // text | json
}

// Auth lists the bearer tokens the API accepts.
type Auth struct {
	Tokens []Token `json:"tokens"`
}

// Roles a token may carry.
const (
	RoleUser     = "user"
	RoleOperator = "operator"
	RoleFinance  = "finance"
	RoleAgent    = "agent"
	// RoleMetrics may read /metrics only (Prometheus's scrape token).
	RoleMetrics = "metrics"
)

// Token is one API credential. Exactly one of Token (the secret itself) or
// TokenSHA256 (its hex SHA-256, so the config file holds no secret) is set.
type Token struct {
	Name        string `json:"name"`
	Role        string `json:"role"`
	Team        string `json:"team,omitempty"` // required for role user
	Token       string `json:"token,omitempty"`
	TokenSHA256 string `json:"tokenSHA256,omitempty"`
}

// Matches reports whether secret is this token, in constant time.
func (t Token) Matches(secret string) bool {
	if t.Token != "" {
		return subtle.ConstantTimeCompare([]byte(t.Token), []byte(secret)) == 1
	}
	sum := sha256.Sum256([]byte(secret))
	return subtle.ConstantTimeCompare([]byte(strings.ToLower(t.TokenSHA256)), []byte(hex.EncodeToString(sum[:]))) == 1
}

// Scheduler tunes the scheduling loop.
type Scheduler struct {
	// Interval between scheduling cycles (a submit or a freed GPU also
	// triggers one at once).
	Interval broker.Duration `json:"interval,omitempty"`
	// DefaultMaxGPUs bounds resources.gpus while no node has registered
	// and no cloud offer is configured.
	DefaultMaxGPUs int `json:"defaultMaxGPUs,omitempty"`
	// MaxNodes bounds resources.nodes (gang size).
	MaxNodes int `json:"maxNodes,omitempty"`
	// FairShareHalfLife is how fast past usage is forgotten: a team's
	// GPU-seconds count half after one half-life.
	FairShareHalfLife broker.Duration `json:"fairShareHalfLife,omitempty"`
	// MaxAge is the wait at which the age factor of the score reaches 1.
	MaxAge broker.Duration `json:"maxAge,omitempty"`
	// StarvationAge is the wait after which a job is promoted ahead of
	// every job that has not waited as long (the starvation guard).
	StarvationAge broker.Duration `json:"starvationAge,omitempty"`
	// PreemptionLimit is how many times a job may be requeued (preempted
	// or its node lost) before its attempts are protected from preemption;
	// 0 is no limit.
	PreemptionLimit int `json:"preemptionLimit,omitempty"`
	// Weights of the multifactor score inside a priority class.
	Weights Weights `json:"weights,omitempty"`
	// MaxSharersPerGPU caps the jobs sharing one card.
	MaxSharersPerGPU int `json:"maxSharersPerGPU,omitempty"`
	// GangLabel is the node label whose value a multi-node job's nodes
	// must share (with GPU model, driver version and pool).
	GangLabel string `json:"gangLabel,omitempty"`
}

// Weights weigh the factors of the multifactor score; each factor lies in
// [0, 1]. Default() sets them; a config may set any of them to 0.
type Weights struct {
	// Age weighs how long the job has waited (up to scheduler.maxAge).
	Age int `json:"age"`
	// FairShare weighs 2^(-usage/share) of the job's team.
	FairShare int `json:"fairShare"`
	// Size weighs the job's GPUs relative to the largest node.
	Size int `json:"size"`
}

// Queue kinds.
const (
	QueueBatch   = "batch"
	QueueLatency = "latency"
)

// Queue is one class of work.
type Queue struct {
	Name string `json:"name"`
	// Kind is batch (training can wait) or latency (must never wait
	// behind batch work).
	Kind           string          `json:"kind,omitempty"`
	DefaultTimeout broker.Duration `json:"defaultTimeout,omitempty"`
	MaxTimeout     broker.Duration `json:"maxTimeout,omitempty"`
	// Sharing lets jobs asking for less than a card's memory share cards.
	Sharing bool `json:"sharing,omitempty"`
	// Reserved is the number of GPUs held for this queue: jobs of other
	// queues may use them only when preemptible, and this queue's jobs
	// take them back by preemption.
	Reserved int `json:"reserved,omitempty"`
}

// Team is one team's fair share and quota.
type Team struct {
	Name string `json:"name"`
	// Share weighs the team in fair share (default 1).
	Share float64 `json:"share,omitempty"`
	// Quota is the team's guaranteed GPUs and borrowing limit; absent
	// means no guarantee and no limit.
	Quota *Quota `json:"quota,omitempty"`
	// Projects caps projects inside the team.
	Projects []Project `json:"projects,omitempty"`
	// Buckets are the object-store locations the team's jobs may read and
	// write: "s3://bucket", "s3://bucket/prefix/", "gs://bucket",
	// "https://host", or "*" for any (docs/data.md).
	Buckets []string `json:"buckets,omitempty"`
}

// Quota is a guaranteed number of GPUs and how many more may be borrowed
// from idle capacity, like Kueue's nominalQuota and borrowingLimit.
type Quota struct {
	// GPUs are guaranteed: the team may take them back by preemption from
	// teams that borrow.
	GPUs int `json:"gpus"`
	// BorrowLimit is how many GPUs above GPUs the team may use; absent
	// means no limit, 0 means no borrowing.
	BorrowLimit *int `json:"borrowLimit,omitempty"`
}

// Project is a quota for one project of a team, with the meaning of
// Quota's fields, counted over the project's jobs only.
type Project struct {
	Name string `json:"name"`
	// GPUs are guaranteed to the project: its jobs may take them back
	// from sibling projects that borrow.
	GPUs int `json:"gpus"`
	// BorrowLimit is how many GPUs above GPUs the project may use; absent
	// means no limit beyond the team's.
	BorrowLimit *int `json:"borrowLimit,omitempty"`
}

// Priority is one priority class; a higher Value runs first.
type Priority struct {
	Name  string `json:"name"`
	Value int    `json:"value"`
}

// AgentPolicy is how the broker treats agents.
type AgentPolicy struct {
	// HeartbeatInterval is how often agents sync.
	HeartbeatInterval broker.Duration `json:"heartbeatInterval,omitempty"`
	// LostAfter is how many missed heartbeats make a node lost.
	LostAfter int `json:"lostAfter,omitempty"`
	// LogLimit caps the log bytes the broker keeps per job attempt.
	LogLimit broker.Quantity `json:"logLimit,omitempty"`
	// MaxCardsPerNode is the most GPUs one node may report (16 unless
	// set); a registration claiming more is refused.
	MaxCardsPerNode int `json:"maxCardsPerNode,omitempty"`
}

// LostTimeout is how long a node may stay silent before it is lost.
func (a AgentPolicy) LostTimeout() time.Duration {
	return time.Duration(a.LostAfter) * a.HeartbeatInterval.D()
}

// Default returns the configuration every field's default comes from.
func Default() Config {
	return Config{
		Listen:  "127.0.0.1:8080",
		DataDir: "./data",
		Store:   "bolt",
		Cluster: "spillway",
		Log:     Log{Level: "info", Format: "text"},
		Scheduler: Scheduler{
			Interval:          broker.Duration(time.Second),
			DefaultMaxGPUs:    8,
			MaxNodes:          64,
			FairShareHalfLife: broker.Duration(7 * 24 * time.Hour),
			MaxAge:            broker.Duration(7 * 24 * time.Hour),
			StarvationAge:     broker.Duration(24 * time.Hour),
			Weights:           Weights{Age: 1000, FairShare: 1000, Size: 0},
			MaxSharersPerGPU:  4,
			GangLabel:         "fabric",
		},
		Agents: AgentPolicy{
			HeartbeatInterval: broker.Duration(2 * time.Second),
			LostAfter:         3,
			LogLimit:          broker.Quantity(16 << 20),
			MaxCardsPerNode:   16,
		},
		HA: HA{
			LeaseTTL:   broker.Duration(10 * time.Second),
			AgentGrace: broker.Duration(40 * time.Second),
		},
	}
}

// DefaultQueues are shipped when the config names none.
func DefaultQueues() []Queue {
	return []Queue{
		{Name: "default", Kind: QueueBatch, DefaultTimeout: broker.Duration(4 * time.Hour), MaxTimeout: broker.Duration(7 * 24 * time.Hour)},
		{Name: "inference", Kind: QueueLatency, DefaultTimeout: broker.Duration(time.Hour), MaxTimeout: broker.Duration(30 * 24 * time.Hour), Sharing: true},
		{Name: "high_perf", Kind: QueueBatch, DefaultTimeout: broker.Duration(12 * time.Hour), MaxTimeout: broker.Duration(14 * 24 * time.Hour)},
	}
}

// DefaultPriorities are shipped when the config names none.
func DefaultPriorities() []Priority {
	return []Priority{{Name: "low", Value: 100}, {Name: "medium", Value: 200}, {Name: "high", Value: 300}}
}

// Placeholder marks what an example config leaves for the operator to
// fill in (token hashes, passwords): a config still holding it is refused,
// so no example ships a usable secret.
const Placeholder = "REPLACE-ME"

// Load reads and validates a config file. Relative paths inside it are
// resolved against the file's directory.
func Load(path string) (*Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if !filepath.IsAbs(c.DataDir) {
		c.DataDir = filepath.Join(filepath.Dir(path), c.DataDir)
	}
	return c, nil
}

// LoadWritten reads a config file once and returns it twice: validated
// with every default filled in, as Load does, and as written, decoded
// onto Default() with none of the defaults derived from other fields
// (advertiseURL and ha.peerURL from listen, ha.brokerID, queue timeouts
// ...). A config reload compares two files' written values, so it reports
// only the fields the operator changed: a new listen address is "listen",
// not also "advertiseURL" and "ha", whose derived values moved with it.
func LoadWritten(path string) (cfg, written *Config, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read config: %w", err)
	}
	if cfg, err = Parse(raw); err != nil {
		return nil, nil, fmt.Errorf("config %s: %w", path, err)
	}
	if !filepath.IsAbs(cfg.DataDir) {
		cfg.DataDir = filepath.Join(filepath.Dir(path), cfg.DataDir)
	}
	w := Default()
	if err := broker.DecodeStrict(raw, &w); err != nil {
		// Parse decoded the same bytes without error.
		return nil, nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, &w, nil
}

// Parse reads a YAML config, applies defaults and validates it.
func Parse(raw []byte) (*Config, error) {
	c := Default()
	if err := broker.DecodeStrict(raw, &c); err != nil {
		return nil, err
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) applyDefaults() {
	d := Default()
	if len(c.Queues) == 0 {
		c.Queues = DefaultQueues()
	}
	if len(c.Priorities) == 0 {
		c.Priorities = DefaultPriorities()
	}
	for i := range c.Queues {
		q := &c.Queues[i]
		q.Kind = cmp.Or(q.Kind, QueueBatch)
		q.DefaultTimeout = cmp.Or(q.DefaultTimeout, broker.Duration(4*time.Hour))
		q.MaxTimeout = cmp.Or(q.MaxTimeout, broker.Duration(7*24*time.Hour))
	}
	scheme := "http://"
	if c.TLS.Enabled() {
		scheme = "https://"
	}
	c.AdvertiseURL = cmp.Or(c.AdvertiseURL, scheme+c.Listen)
	c.applySecurityDefaults()
	c.Scheduler.Interval = cmp.Or(c.Scheduler.Interval, d.Scheduler.Interval)
	c.Scheduler.DefaultMaxGPUs = cmp.Or(c.Scheduler.DefaultMaxGPUs, d.Scheduler.DefaultMaxGPUs)
	c.Scheduler.MaxNodes = cmp.Or(c.Scheduler.MaxNodes, d.Scheduler.MaxNodes)
	c.Scheduler.FairShareHalfLife = cmp.Or(c.Scheduler.FairShareHalfLife, d.Scheduler.FairShareHalfLife)
	c.Scheduler.MaxAge = cmp.Or(c.Scheduler.MaxAge, d.Scheduler.MaxAge)
	c.Scheduler.StarvationAge = cmp.Or(c.Scheduler.StarvationAge, d.Scheduler.StarvationAge)
	c.Scheduler.MaxSharersPerGPU = cmp.Or(c.Scheduler.MaxSharersPerGPU, d.Scheduler.MaxSharersPerGPU)
	c.Scheduler.GangLabel = cmp.Or(c.Scheduler.GangLabel, d.Scheduler.GangLabel)
	for i := range c.Teams {
		c.Teams[i].Share = cmp.Or(c.Teams[i].Share, 1)
	}
	c.Agents.HeartbeatInterval = cmp.Or(c.Agents.HeartbeatInterval, d.Agents.HeartbeatInterval)
	c.Agents.LostAfter = cmp.Or(c.Agents.LostAfter, d.Agents.LostAfter)
	c.Agents.LogLimit = cmp.Or(c.Agents.LogLimit, d.Agents.LogLimit)
	c.Agents.MaxCardsPerNode = cmp.Or(c.Agents.MaxCardsPerNode, d.Agents.MaxCardsPerNode)
	c.HA.LeaseTTL = cmp.Or(c.HA.LeaseTTL, d.HA.LeaseTTL)
	c.HA.RenewInterval = cmp.Or(c.HA.RenewInterval, c.HA.LeaseTTL/3)
	c.HA.AgentGrace = cmp.Or(c.HA.AgentGrace, d.HA.AgentGrace)
	if c.HA.BrokerID == "" {
		host, err := os.Hostname()
		if err != nil || !nameRe.MatchString(host) {
			host = "broker"
		}
		port := c.Listen
		if i := strings.LastIndex(c.Listen, ":"); i >= 0 {
			port = c.Listen[i+1:]
		}
		c.HA.BrokerID = clipName(host + "-" + port)
	}
	if c.HA.PeerURL == "" {
		c.HA.PeerURL = scheme + c.Listen
		if h, port, err := net.SplitHostPort(c.Listen); err == nil && (h == "" || h == "0.0.0.0" || h == "::") {
			if host, err := os.Hostname(); err == nil {
				c.HA.PeerURL = scheme + net.JoinHostPort(host, port)
			}
		}
	}
	c.observeDefaults()
	c.burstDefaults()
	c.slurmDefaults()
}

// clipName keeps a derived name within nameRe's 63 characters.
func clipName(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Validate checks the whole configuration and names the field of every
// problem.
func (c *Config) Validate() error {
	ve := &broker.ValidationError{}
	add := func(field, code, format string, args ...any) {
		ve.Errors = append(ve.Errors, broker.FieldError{Field: field, Code: code, Message: fmt.Sprintf(format, args...)})
	}
	if c.Listen == "" {
		add("listen", broker.CodeRequired, "is required, e.g. 127.0.0.1:8080")
	}
	c.validateSecurity(add)
	if c.DataDir == "" {
		add("dataDir", broker.CodeRequired, "is required")
	}
	switch {
	case c.Store == "" || c.Store == "bolt":
	case strings.Contains(c.Store, Placeholder):
		add("store", broker.CodeRequired, "still has the example's %s: put the Redis password (requirepass) in the URL", Placeholder)
	case strings.HasPrefix(c.Store, "bolt://"):
	case c.IsRedis():
		// broker/adapters checks the URL itself (broker/redis.CheckURL).
	default:
		add("store", broker.CodeInvalid, "must be bolt, bolt:///path/file.db, redis://host:port/db, rediss://… or redis-sentinel://host:port,…/master/db")
	}
	if !nameRe.MatchString(c.Cluster) {
		add("cluster", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
	}
	for i, m := range c.Mounts {
		if m.Source == "" || (strings.HasPrefix(m.Source, "/") && filepath.Clean(m.Source) != m.Source) || (!strings.HasPrefix(m.Source, "/") && !nameRe.MatchString(m.Source)) {
			add(fmt.Sprintf("mounts[%d].source", i), broker.CodeInvalid, "must be a clean absolute host path or a volume name")
		}
	}
	switch c.Log.Level {
	case "", "debug", "info", "warn", "error":
	default:
		add("log.level", broker.CodeInvalid, "must be debug, info, warn or error")
	}
	switch c.Log.Format {
	case "", "text", "json":
	default:
		add("log.format", broker.CodeInvalid, "must be text or json")
	}
	names := map[string]bool{}
	for i, t := range c.Auth.Tokens {
		f := fmt.Sprintf("auth.tokens[%d]", i)
		if !nameRe.MatchString(t.Name) {
			add(f+".name", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
		} else if names[t.Name] {
			add(f+".name", broker.CodeInvalid, "duplicate token name %q", t.Name)
		}
		names[t.Name] = true
		switch t.Role {
		case RoleUser:
			if !nameRe.MatchString(t.Team) {
				add(f+".team", broker.CodeRequired, "is required for role user (the team the token acts for)")
			}
		case RoleOperator, RoleFinance, RoleAgent, RoleMetrics:
		default:
			add(f+".role", broker.CodeInvalid, "must be user, operator, finance, agent or metrics, got %q", t.Role)
		}
		switch {
		case t.Token == Placeholder || t.TokenSHA256 == Placeholder:
			add(f+".tokenSHA256", broker.CodeRequired, "is still the example's %s: run `spillway token create --name %s` and paste the tokenSHA256 it prints", Placeholder, clipName(t.Name))
		case t.Token != "" && t.TokenSHA256 != "":
			add(f, broker.CodeInvalid, "set token or tokenSHA256, not both")
		case t.Token != "" && len(t.Token) < 16:
			add(f+".token", broker.CodeInvalid, "must be at least 16 characters")
		case t.Token == "" && t.TokenSHA256 == "":
			add(f+".token", broker.CodeRequired, "is required (or tokenSHA256)")
		case t.TokenSHA256 != "" && !regexp.MustCompile(`^[0-9a-fA-F]{64}$`).MatchString(t.TokenSHA256):
			add(f+".tokenSHA256", broker.CodeInvalid, "must be 64 hex digits (sha256sum of the token)")
		}
	}
	if c.Scheduler.Interval.D() < 10*time.Millisecond {
		add("scheduler.interval", broker.CodeOutOfRange, "must be at least 10ms")
	}
	if c.Scheduler.DefaultMaxGPUs < 1 || c.Scheduler.DefaultMaxGPUs > 1024 {
		add("scheduler.defaultMaxGPUs", broker.CodeOutOfRange, "must be between 1 and 1024")
	}
	if c.Scheduler.MaxNodes < 1 || c.Scheduler.MaxNodes > 256 {
		add("scheduler.maxNodes", broker.CodeOutOfRange, "must be between 1 and 256")
	}
	c.validateScheduling(add)
	qnames := map[string]bool{}
	for i, q := range c.Queues {
		f := fmt.Sprintf("queues[%d]", i)
		if !nameRe.MatchString(q.Name) {
			add(f+".name", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
		} else if qnames[q.Name] {
			add(f+".name", broker.CodeInvalid, "duplicate queue %q", q.Name)
		}
		qnames[q.Name] = true
		if q.Kind != QueueBatch && q.Kind != QueueLatency {
			add(f+".kind", broker.CodeInvalid, "must be batch or latency")
		}
		if q.DefaultTimeout <= 0 || q.MaxTimeout <= 0 || q.DefaultTimeout > q.MaxTimeout {
			add(f+".defaultTimeout", broker.CodeOutOfRange, "must be greater than 0 and at most maxTimeout")
		}
		if q.Reserved < 0 || q.Reserved > maxGPUCount {
			add(f+".reserved", broker.CodeOutOfRange, "must be between 0 and %d GPUs", maxGPUCount)
		}
	}
	if len(c.Queues) > 0 && !qnames["default"] {
		add("queues", broker.CodeRequired, "must include a queue named default")
	}
	pnames := map[string]bool{}
	for i, p := range c.Priorities {
		f := fmt.Sprintf("priorities[%d]", i)
		if !nameRe.MatchString(p.Name) {
			add(f+".name", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
		} else if pnames[p.Name] {
			add(f+".name", broker.CodeInvalid, "duplicate priority %q", p.Name)
		}
		pnames[p.Name] = true
		if p.Value < 0 || p.Value > 1_000_000 {
			add(f+".value", broker.CodeOutOfRange, "must be between 0 and 1000000")
		}
	}
	if c.Agents.HeartbeatInterval.D() < 100*time.Millisecond || c.Agents.HeartbeatInterval.D() > 5*time.Minute {
		add("agents.heartbeatInterval", broker.CodeOutOfRange, "must be between 100ms and 5m")
	}
	if c.Agents.LostAfter < 2 || c.Agents.LostAfter > 100 {
		add("agents.lostAfter", broker.CodeOutOfRange, "must be between 2 and 100 missed heartbeats")
	}
	if c.Agents.LogLimit < 1<<10 {
		add("agents.logLimit", broker.CodeOutOfRange, "must be at least 1Ki")
	}
	if c.Agents.MaxCardsPerNode < 1 || c.Agents.MaxCardsPerNode > 256 {
		add("agents.maxCardsPerNode", broker.CodeOutOfRange, "must be between 1 and 256")
	}
	if !nameRe.MatchString(c.HA.BrokerID) {
		add("ha.brokerID", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
	}
	if u, err := url.Parse(c.HA.PeerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Contains(c.HA.PeerURL, "|") {
		add("ha.peerURL", broker.CodeInvalid, "must be an http:// or https:// URL that reaches this broker")
	}
	if ttl := c.HA.LeaseTTL.D(); ttl < 500*time.Millisecond || ttl > 5*time.Minute {
		add("ha.leaseTTL", broker.CodeOutOfRange, "must be between 500ms and 5m")
	} else if r := c.HA.RenewInterval.D(); r <= 0 || r >= ttl/2 {
		add("ha.renewInterval", broker.CodeOutOfRange, "must be above 0 and under half of ha.leaseTTL (%s)", c.HA.LeaseTTL)
	}
	if g := c.HA.AgentGrace.D(); g < 0 || g > time.Hour {
		add("ha.agentGrace", broker.CodeOutOfRange, "must be between 0 and 1h")
	}
	c.validateObserve(add)
	c.validateBurst(add)
	c.validateSlurm(add)
	if comp, err := c.Billing.Compile(); err != nil {
		var joined interface{ Unwrap() []error }
		errs := []error{err}
		if errors.As(err, &joined) {
			errs = joined.Unwrap()
		}
		for _, e := range errs {
			var ce *billing.ConfigError
			if errors.As(e, &ce) {
				add(ce.Field, broker.CodeInvalid, "%s", ce.Message)
			} else {
				add("billing", broker.CodeInvalid, "%v", e)
			}
		}
	} else {
		c.billing = comp
	}
	if len(ve.Errors) == 0 {
		return nil
	}
	return ve
}

// BillingCompiled is the billing section after Validate checked it.
func (c *Config) BillingCompiled() billing.Compiled { return c.billing }

// DefaultPriority is the class a spec gets when it names none: "medium"
// when configured, else the middle class.
func (c *Config) DefaultPriority() string {
	for _, p := range c.Priorities {
		if p.Name == "medium" {
			return p.Name
		}
	}
	return c.Priorities[len(c.Priorities)/2].Name
}

// Queue returns the named queue.
func (c *Config) Queue(name string) (Queue, bool) {
	for _, q := range c.Queues {
		if q.Name == name {
			return q, true
		}
	}
	return Queue{}, false
}

// PriorityValue returns a class's value (0 when unknown).
func (c *Config) PriorityValue(name string) int {
	for _, p := range c.Priorities {
		if p.Name == name {
			return p.Value
		}
	}
	return 0
}

// SpecLimits is what job validation needs from the config; MaxGPUs and
// MaxGPUMemory come from the live inventory and the caller fills them.
func (c *Config) SpecLimits() broker.SpecLimits {
	lim := broker.SpecLimits{
		Queues:          map[string]broker.QueueLimits{},
		DefaultQueue:    "default",
		DefaultPriority: c.DefaultPriority(),
		MaxGPUs:         c.Scheduler.DefaultMaxGPUs,
		MaxNodes:        c.Scheduler.MaxNodes,
		Mounts:          c.Mounts,
	}
	for _, q := range c.Queues {
		lim.Queues[q.Name] = broker.QueueLimits{DefaultTimeout: q.DefaultTimeout.D(), MaxTimeout: q.MaxTimeout.D()}
	}
	for _, p := range c.Priorities {
		lim.Priorities = append(lim.Priorities, p.Name)
	}
	for _, t := range c.Teams {
		if len(t.Buckets) > 0 {
			if lim.Buckets == nil {
				lim.Buckets = map[string][]string{}
			}
			lim.Buckets[t.Name] = t.Buckets
		}
	}
	return lim
}

// StorePath is the bbolt file the config selects ("" for Redis).
func (c *Config) StorePath() string {
	switch {
	case c.Store == "" || c.Store == "bolt":
		return filepath.Join(c.DataDir, "spillway.db")
	case strings.HasPrefix(c.Store, "bolt://"):
		return strings.TrimPrefix(c.Store, "bolt://")
	}
	return ""
}
