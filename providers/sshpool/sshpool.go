// Package sshpool offers leased machines the broker can already reach over
// SSH: hosts listed in config with their GPUs, price and lease end, and a
// pinned host key each.
//
// "Create" claims a free host for a record, "Delete" gives it back. The
// pool persists nothing: the broker's instance records are the truth, and
// on start the broker hands them back with Restore before anything else.
//
// Leased capacity is paid for whether used or not, so its offers are
// marked Prepaid: providers.SortOffers ranks them before any priced offer
// and a burst budget need not reserve for them, while PricePerHour still
// carries the lease price for billing. A host whose lease ends within the
// drain margin is no longer offered or claimable; the broker drains hosts
// already claimed before Instance.LeaseEnds.
//
// Giving a host back does not touch it: the broker revokes the agent's
// token and calls bootstrap.Stop before Delete, so the next claim starts
// clean (and skips the binary upload when it is still there).
package sshpool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
)

// Config is one pool under the broker config's `providers:` key.
type Config struct {
	// Name is the provider's name in offers and records; default "sshpool".
	Name string `json:"name,omitempty"`
	// Region labels the pool's site in offers; default "lease".
	Region string `json:"region,omitempty"`
	// Currency of the prices; default "USD".
	Currency string `json:"currency,omitempty"`
	// DrainMargin is how long before a lease ends a host stops being
	// offered, as a Go duration ("48h"); default 24h.
	DrainMargin string `json:"drainMargin,omitempty"`
	Hosts       []Host `json:"hosts"`
}

// Host is one leased machine.
type Host struct {
	// Name identifies the host; it is the instance id and the offer's
	// instance type.
	Name string `json:"name"`
	// Address is "host:port" or "host" (port 22).
	Address string `json:"address"`
	// User is the SSH login; default "root".
	User         string `json:"user,omitempty"`
	GPUModel     string `json:"gpuModel"`
	GPUs         int    `json:"gpus"`
	GPUMemoryGiB int    `json:"gpuMemoryGiB"`
	CPUs         int    `json:"cpus"`
	MemoryGiB    int    `json:"memoryGiB"`
	// PricePerGPUHour is the lease price per GPU-hour.
	PricePerGPUHour billing.Amount `json:"pricePerGPUHour"`
	// LeaseEnds is when the host goes back to its owner (RFC 3339).
	LeaseEnds time.Time `json:"leaseEnds"`
	// HostKey is the pinned host key, in authorized_keys form; several
	// lines for several key types.
	HostKey string `json:"hostKey"`
}

// Provider is the pool.
type Provider struct {
	cfg    Config
	margin time.Duration
	hosts  map[string]poolHost
	now    func() time.Time

	mu     sync.Mutex
	claims map[string]providers.Instance // host name → claim
}

type poolHost struct {
	Host
	keys []ssh.PublicKey
}

var hostNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// New checks the config. now is the clock for lease ends and claim times;
// time.Now when nil.
func New(cfg Config, now func() time.Time) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sshpool config: %w", err)
	}
	cfg.Name = cmp.Or(cfg.Name, "sshpool")
	cfg.Region = cmp.Or(cfg.Region, "lease")
	cfg.Currency = cmp.Or(cfg.Currency, "USD")
	cfg.DrainMargin = cmp.Or(cfg.DrainMargin, "24h")
	margin, _ := time.ParseDuration(cfg.DrainMargin)
	if now == nil {
		now = time.Now
	}
	p := &Provider{cfg: cfg, margin: margin, hosts: map[string]poolHost{}, now: now, claims: map[string]providers.Instance{}}
	for _, h := range cfg.Hosts {
		h.Address = hostAddress(h.Address)
		h.User = cmp.Or(h.User, "root")
		keys, _ := providers.ParseAuthorizedKeys(h.HostKey)
		p.hosts[h.Name] = poolHost{Host: h, keys: keys}
	}
	return p, nil
}

// hostAddress is "host:port", port 22 when the address names none.
func hostAddress(a string) string {
	if _, _, err := net.SplitHostPort(a); err != nil {
		return net.JoinHostPort(a, "22")
	}
	return a
}

// Validate checks the section as the broker config gives it; each
// problem is a *providers.ConfigError naming its field.
func (c *Config) Validate() error {
	var errs providers.ConfigErrors
	if c.DrainMargin != "" {
		if margin, err := time.ParseDuration(c.DrainMargin); err != nil || margin < 0 {
			errs.Add("drainMargin", "want a duration like 24h, got %q", c.DrainMargin)
		}
	}
	seen := map[string]bool{}
	for i, h := range c.Hosts {
		field := fmt.Sprintf("hosts[%d]", i)
		if !hostNamePattern.MatchString(h.Name) {
			errs.Add(field+".name", "want 1-63 letters, digits, '.', '_' or '-', got %q", h.Name)
		} else if seen[h.Name] {
			errs.Add(field+".name", "%q is used twice", h.Name)
		}
		seen[h.Name] = true
		if _, _, err := net.SplitHostPort(hostAddress(h.Address)); err != nil || h.Address == "" {
			errs.Add(field+".address", "want host or host:port, got %q", h.Address)
		}
		if h.GPUs <= 0 || h.PricePerGPUHour < 0 || h.LeaseEnds.IsZero() {
			errs.Add(field, "want gpus > 0, pricePerGPUHour >= 0 and a leaseEnds date")
		}
		if keys, err := providers.ParseAuthorizedKeys(h.HostKey); err != nil || len(keys) == 0 {
			errs.Add(field+".hostKey", "want at least one key in authorized_keys form")
		}
	}
	return errs.Err()
}

// Name returns the configured name.
func (p *Provider) Name() string { return p.cfg.Name }

// Restore tells the pool which hosts the broker's records hold, replacing
// what it knew: call it on start, before any other method. A record naming
// a host no longer in config is an error (and is not restored).
func (p *Provider) Restore(claims []providers.Instance) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.claims = map[string]providers.Instance{}
	var errs []error
	for _, c := range claims {
		h, ok := p.hosts[c.ID]
		if !ok {
			errs = append(errs, fmt.Errorf("restore record %s: host %q is not in the pool", c.RecordID, c.ID))
			continue
		}
		if prev, ok := p.claims[c.ID]; ok && prev.RecordID != c.RecordID {
			errs = append(errs, fmt.Errorf("restore record %s: host %q is already held by record %s", c.RecordID, c.ID, prev.RecordID))
			continue
		}
		p.claims[c.ID] = p.instance(h, c.RecordID, c.Tags, c.LaunchedAt)
	}
	return errors.Join(errs...)
}

func (p *Provider) draining(h poolHost) bool {
	return !p.now().Add(p.margin).Before(h.LeaseEnds)
}

// Offers lists every host, Prepaid, Available when free and not within
// the drain margin of its lease end.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []providers.Offer
	for _, name := range slices.Sorted(maps.Keys(p.hosts)) {
		h := p.hosts[name]
		_, claimed := p.claims[name]
		ends := h.LeaseEnds
		out = append(out, providers.Offer{
			Provider: p.cfg.Name, Region: p.cfg.Region, InstanceType: name,
			GPUModel: h.GPUModel, GPUs: h.GPUs, GPUMemoryBytes: int64(h.GPUMemoryGiB) << 30,
			CPUs: h.CPUs, MemoryBytes: int64(h.MemoryGiB) << 30,
			PricePerHour: h.PricePerGPUHour * billing.Amount(h.GPUs), Currency: p.cfg.Currency,
			PriceSource: providers.PriceFromConfig, Prepaid: true, Available: !claimed && !p.draining(h), LeaseEnds: &ends,
		})
	}
	return out, nil
}

func (p *Provider) instance(h poolHost, record string, tags map[string]string, since time.Time) providers.Instance {
	ends := h.LeaseEnds
	return providers.Instance{
		ID: h.Name, RecordID: record, Provider: p.cfg.Name, Region: p.cfg.Region, InstanceType: h.Name,
		State: providers.StateRunning, SSHHost: h.Address, SSHUser: h.User, LaunchedAt: since,
		Tags: maps.Clone(tags), LeaseEnds: &ends,
	}
}

// Create claims the host named by the offer's instance type for the
// record; a repeat for the same record returns the same claim.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (*providers.Instance, error) {
	if err := req.Validate(); err != nil {
		return nil, providers.NewError(providers.ErrInvalidRequest, p.cfg.Name, "create", "", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.hosts[req.Offer.InstanceType]
	if !ok {
		return nil, providers.NewError(providers.ErrInvalidRequest, p.cfg.Name, "create", "", fmt.Errorf("no host %q in the pool", req.Offer.InstanceType))
	}
	if c, ok := p.claims[h.Name]; ok {
		if c.RecordID == req.RecordID {
			return &c, nil
		}
		return nil, providers.NewError(providers.ErrInsufficientCapacity, p.cfg.Name, "create", "HostClaimed", fmt.Errorf("host %s is held by record %s", h.Name, c.RecordID))
	}
	if p.draining(h) {
		return nil, providers.NewError(providers.ErrInsufficientCapacity, p.cfg.Name, "create", "LeaseEnding", fmt.Errorf("host %s lease ends %s", h.Name, h.LeaseEnds.Format(time.RFC3339)))
	}
	c := p.instance(h, req.RecordID, req.Tags, p.now())
	p.claims[h.Name] = c
	return &c, nil
}

// Get returns a claimed host; an unclaimed one is ErrNotFound.
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.claims[id]
	if !ok {
		return nil, providers.NewError(providers.ErrNotFound, p.cfg.Name, "get", "", fmt.Errorf("host %q is not claimed", id))
	}
	return &c, nil
}

// List returns the claimed hosts, by name.
func (p *Provider) List(ctx context.Context) ([]providers.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []providers.Instance
	for _, name := range slices.Sorted(maps.Keys(p.claims)) {
		out = append(out, p.claims[name])
	}
	return out, nil
}

// Delete gives a claimed host back to the pool; ErrNotFound when it is not
// claimed (any more).
func (p *Provider) Delete(ctx context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.claims[id]; !ok {
		return providers.NewError(providers.ErrNotFound, p.cfg.Name, "delete", "", fmt.Errorf("host %q is not claimed", id))
	}
	delete(p.claims, id)
	return nil
}

// HostKeys returns the host's pinned keys from config, claimed or not.
func (p *Provider) HostKeys(ctx context.Context, id string) ([]ssh.PublicKey, error) {
	h, ok := p.hosts[id]
	if !ok {
		return nil, providers.NewError(providers.ErrNotFound, p.cfg.Name, "host keys", "", fmt.Errorf("no host %q in the pool", id))
	}
	return slices.Clone(h.keys), nil
}

var _ providers.Provider = (*Provider)(nil)
