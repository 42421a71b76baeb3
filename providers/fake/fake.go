// Package fake is a Provider with behaviour, for broker tests, in the manner
// of Karpenter's fake CloudProvider: offers listed cheapest first, capacity
// per offer that runs out and comes back on delete, knobs for the next
// error and for how many creates may succeed, call recorders, and Reset.
//
// A test can back every fake machine with something real (an sshd from
// providers/fakecloud) through Boot, so the bootstrap runs against it.
//
// Knobs and recorders are plain fields, as in Karpenter's fake: set them
// between calls, never while another goroutine is calling the provider.
package fake

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/providers"
)

// Machine is what Boot returns for a new fake instance: where to reach it
// and the host keys the fake provider vouches for.
type Machine struct {
	SSHHost  string
	SSHUser  string
	HostKeys []ssh.PublicKey
}

// Unlimited is the capacity of an offer that never runs out.
const Unlimited = -1

// Provider is the fake. The zero value is not usable; call New.
type Provider struct {
	mu   sync.Mutex
	name string

	// offers and capacity are the configuration Reset returns to.
	offers   []providers.Offer
	capacity map[string]int

	// Knobs.

	// NextCreateErr, when set, is returned by the next Create and cleared.
	NextCreateErr error
	// NextDeleteErr, when set, is returned by the next Delete and cleared.
	NextDeleteErr error
	// AllowedCreateCalls caps how many Creates may launch a machine; later
	// ones fail with ErrInsufficientCapacity. Negative means no cap.
	AllowedCreateCalls int
	// Boot, when set, is called for every new machine (not for an
	// idempotent repeat). Its error fails the Create.
	Boot func(ctx context.Context, inst providers.Instance, req providers.CreateRequest) (Machine, error)
	// Terminate, when set, is called once when a machine is deleted.
	Terminate func(inst providers.Instance)
	// Now is the clock for LaunchedAt; time.Now when nil.
	Now func() time.Time

	// Recorders.

	// CreateCalls records every Create request, in order.
	CreateCalls []providers.CreateRequest
	// DeleteCalls records every Delete id, in order.
	DeleteCalls []string
	// GetCalls records every Get id, in order.
	GetCalls []string
	// ListCalls counts List calls.
	ListCalls int

	remaining map[string]int
	instances map[string]*entry
	byRecord  map[string]string
	seq       int
}

type entry struct {
	inst     providers.Instance
	hostKeys []ssh.PublicKey
	offerKey string
}

// New returns a fake named name offering offers. capacity maps an offer's
// Key to how many machines it can launch at once; offers not in the map
// are Unlimited.
func New(name string, offers []providers.Offer, capacity map[string]int) *Provider {
	p := &Provider{name: name, offers: slices.Clone(offers), capacity: maps.Clone(capacity)}
	for i := range p.offers {
		p.offers[i].Provider = name
	}
	p.Reset()
	return p
}

// Reset forgets every machine, call and knob and restores the capacities
// given to New. Boot, Terminate and Now are setup, not knobs: they stay.
func (p *Provider) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.NextCreateErr, p.NextDeleteErr = nil, nil
	p.AllowedCreateCalls = -1
	p.CreateCalls, p.DeleteCalls, p.GetCalls, p.ListCalls = nil, nil, nil, 0
	p.remaining = map[string]int{}
	for _, o := range p.offers {
		c, ok := p.capacity[o.Key()]
		if !ok {
			c = Unlimited
		}
		p.remaining[o.Key()] = c
	}
	p.instances = map[string]*entry{}
	p.byRecord = map[string]string{}
	p.seq = 0
}

// SetCapacity sets how many more machines the offer with key can launch.
func (p *Provider) SetCapacity(key string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.remaining[key] = n
}

// Name returns the fake's name.
func (p *Provider) Name() string { return p.name }

// Offers returns the offers, cheapest first, with Available false for
// those whose capacity has run out.
func (p *Provider) Offers(ctx context.Context) ([]providers.Offer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Clone(p.offers)
	for i := range out {
		out[i].Available = p.remaining[out[i].Key()] != 0
	}
	providers.SortOffers(out)
	return out, nil
}

// Create launches a fake machine, or returns the one already launched for
// the record id.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) (*providers.Instance, error) {
	p.mu.Lock()
	p.CreateCalls = append(p.CreateCalls, req)
	if err := p.NextCreateErr; err != nil {
		p.NextCreateErr = nil
		p.mu.Unlock()
		return nil, err
	}
	if err := req.Validate(); err != nil {
		p.mu.Unlock()
		return nil, providers.NewError(providers.ErrInvalidRequest, p.name, "create", "", err)
	}
	if id, ok := p.byRecord[req.RecordID]; ok {
		inst := p.instances[id].inst
		p.mu.Unlock()
		return &inst, nil
	}
	offer, ok := providers.FindOffer(p.offers, providers.Offer{Provider: p.name, Region: req.Offer.Region, Zone: req.Offer.Zone, InstanceType: req.Offer.InstanceType, Spot: req.Offer.Spot})
	if !ok {
		p.mu.Unlock()
		return nil, providers.NewError(providers.ErrInvalidRequest, p.name, "create", "UnknownOffer", fmt.Errorf("no offer %s", req.Offer.Key()))
	}
	if p.AllowedCreateCalls == 0 {
		p.mu.Unlock()
		return nil, providers.NewError(providers.ErrInsufficientCapacity, p.name, "create", "AllowedCreateCallsExceeded", nil)
	}
	if p.remaining[offer.Key()] == 0 {
		p.mu.Unlock()
		return nil, providers.NewError(providers.ErrInsufficientCapacity, p.name, "create", "OfferExhausted", fmt.Errorf("offer %s", offer.Key()))
	}
	if p.AllowedCreateCalls > 0 {
		p.AllowedCreateCalls--
	}
	if p.remaining[offer.Key()] > 0 {
		p.remaining[offer.Key()]--
	}
	p.seq++
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	inst := providers.Instance{
		ID:           fmt.Sprintf("fake-%d", p.seq),
		RecordID:     req.RecordID,
		Provider:     p.name,
		Region:       offer.Region,
		Zone:         offer.Zone,
		InstanceType: offer.InstanceType,
		Spot:         offer.Spot,
		State:        providers.StateRunning,
		LaunchedAt:   now(),
		Tags:         maps.Clone(req.Tags),
		LeaseEnds:    offer.LeaseEnds,
	}
	e := &entry{inst: inst, offerKey: offer.Key()}
	p.instances[inst.ID] = e
	p.byRecord[req.RecordID] = inst.ID
	boot := p.Boot
	p.mu.Unlock()

	if boot == nil {
		return &inst, nil
	}
	// Boot runs outside the lock: it may start real processes.
	m, err := boot(ctx, inst, req)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		delete(p.instances, inst.ID)
		delete(p.byRecord, req.RecordID)
		if p.remaining[e.offerKey] >= 0 {
			p.remaining[e.offerKey]++
		}
		return nil, fmt.Errorf("boot fake machine: %w", err)
	}
	e.inst.SSHHost, e.inst.SSHUser, e.hostKeys = m.SSHHost, m.SSHUser, m.HostKeys
	inst = e.inst
	return &inst, nil
}

// Get returns a live machine, or ErrNotFound.
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.GetCalls = append(p.GetCalls, id)
	e, ok := p.instances[id]
	if !ok {
		return nil, providers.NewError(providers.ErrNotFound, p.name, "get", "", fmt.Errorf("instance %s", id))
	}
	inst := e.inst
	return &inst, nil
}

// List returns every live machine, by id.
func (p *Provider) List(ctx context.Context) ([]providers.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ListCalls++
	out := make([]providers.Instance, 0, len(p.instances))
	for _, id := range slices.Sorted(maps.Keys(p.instances)) {
		out = append(out, p.instances[id].inst)
	}
	return out, nil
}

// Delete ends a machine at once and gives its capacity back; the next
// Delete of the same id returns ErrNotFound.
func (p *Provider) Delete(ctx context.Context, id string) error {
	p.mu.Lock()
	p.DeleteCalls = append(p.DeleteCalls, id)
	if err := p.NextDeleteErr; err != nil {
		p.NextDeleteErr = nil
		p.mu.Unlock()
		return err
	}
	e, ok := p.instances[id]
	if !ok {
		p.mu.Unlock()
		return providers.NewError(providers.ErrNotFound, p.name, "delete", "", fmt.Errorf("instance %s", id))
	}
	delete(p.instances, id)
	delete(p.byRecord, e.inst.RecordID)
	if p.remaining[e.offerKey] >= 0 {
		p.remaining[e.offerKey]++
	}
	term := p.Terminate
	p.mu.Unlock()
	if term != nil {
		e.inst.State = providers.StateTerminated
		term(e.inst)
	}
	return nil
}

// HostKeys returns the keys Boot reported for the machine.
func (p *Provider) HostKeys(ctx context.Context, id string) ([]ssh.PublicKey, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.instances[id]
	if !ok {
		return nil, providers.NewError(providers.ErrNotFound, p.name, "host keys", "", fmt.Errorf("instance %s", id))
	}
	return slices.Clone(e.hostKeys), nil
}

var _ providers.Provider = (*Provider)(nil)
