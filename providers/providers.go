// Package providers is the hand that reaches outside: it turns "we need 8
// more H100s" into a machine that can run a Spillway agent. The Provider
// interface, shaped like Karpenter's CloudProvider, is implemented once per
// backend in its own package (aws, gcp, lease, sshpool, fake); the SSH
// bootstrap that every backend shares lives in providers/bootstrap.
//
// Nothing here imports the broker. The broker owns the durable records; a
// provider only knows what its API (or, for sshpool, what the broker told
// it on start) knows.
package providers

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
)

// Provider creates, finds and ends machines on one backend (one cloud
// account and region, one marketplace account, one pool of leased hosts).
//
// The contract every implementation keeps:
//
//   - Offers lists what can be launched now, with prices. Offers are cheap
//     to call; the burst controller calls them on every decision.
//   - Create is idempotent on CreateRequest.RecordID, the broker's record id:
//     calling it again with the same record id (after a timeout, a crash, a
//     retry) returns the machine the first call launched and never launches
//     a second one. A machine that cannot be had fails with an error for
//     which IsNextOffer is true (capacity, quota, unsupported), so the
//     caller moves on to the next offer.
//   - Get returns the machine with the provider's id, or ErrNotFound.
//   - List returns only machines carrying this cluster's tag (and nothing
//     that is already terminated). The broker compares it with its records
//     on start and periodically, and deletes what it has no record of.
//   - Delete starts ending the machine and returns nil while it is going
//     away; once the machine is gone it returns ErrNotFound. Callers retry
//     Delete until they see ErrNotFound: that is the only proof the machine
//     no longer costs money.
//   - HostKeys returns the SSH host keys the provider vouches for, through a
//     channel other than the SSH connection itself (EC2 console output, GCE
//     guest attributes, a key pinned in config or injected at launch). An
//     empty list means "not published yet": the caller waits and asks
//     again. The bootstrap accepts no other key.
//
// Errors are typed (see errors.go) and never need string matching.
type Provider interface {
	// Name is the configured name of this provider ("aws-us-east-1").
	Name() string
	// Offers lists what this provider can launch, cheapest or not; use
	// SortOffers for the burst controller's order.
	Offers(ctx context.Context) ([]Offer, error)
	// Create launches (or finds, for a record id seen before) one machine.
	Create(ctx context.Context, req CreateRequest) (*Instance, error)
	// Get returns one machine by the provider's id.
	Get(ctx context.Context, id string) (*Instance, error)
	// List returns the live machines that carry this cluster's tag.
	List(ctx context.Context) ([]Instance, error)
	// Delete ends a machine; ErrNotFound once it is gone.
	Delete(ctx context.Context, id string) error
	// HostKeys returns the SSH host keys the provider vouches for.
	HostKeys(ctx context.Context, id string) ([]ssh.PublicKey, error)
}

// Offer is one thing a provider can launch: an instance type in a place,
// spot or on-demand, at a price.
type Offer struct {
	// Provider is the configured provider name that made the offer.
	Provider string `json:"provider"`
	Region   string `json:"region"`
	// Zone is empty when the provider picks the zone.
	Zone         string `json:"zone,omitempty"`
	InstanceType string `json:"instanceType"`
	// GPUModel is a short normalised name: "H100", "A100-80GB", "L4".
	GPUModel string `json:"gpuModel"`
	GPUs     int    `json:"gpus"`
	// GPUMemoryBytes is the memory of one GPU.
	GPUMemoryBytes int64 `json:"gpuMemoryBytes"`
	CPUs           int   `json:"cpus"`
	MemoryBytes    int64 `json:"memoryBytes"`
	Spot           bool  `json:"spot"`
	// PricePerHour is what the whole machine costs per hour, in Currency.
	// For prepaid capacity it is the lease price, which billing charges to
	// the team that uses it.
	PricePerHour billing.Amount `json:"pricePerHour"`
	Currency     string         `json:"currency"`
	// PriceSource says where PricePerHour comes from (PriceFromConfig,
	// PriceFromPriceList, PriceFromSpotHistory, PriceFromAPI); PricedAt
	// is when that source set it (zero for configured prices).
	PriceSource string    `json:"priceSource,omitempty"`
	PricedAt    time.Time `json:"pricedAt,omitzero"`
	// Prepaid marks capacity paid for whether used or not (leased hosts).
	// Its marginal cost is zero: SortOffers ranks it before any price, and
	// a burst budget need not reserve for it.
	Prepaid bool `json:"prepaid,omitempty"`
	// Available is false when the provider knows it cannot launch this now
	// (no capacity reported, host claimed, lease ending).
	Available bool `json:"available"`
	// LeaseEnds is when leased capacity goes back; nil for clouds.
	LeaseEnds *time.Time `json:"leaseEnds,omitempty"`
}

// Key identifies an offer within a provider: provider, region, zone,
// instance type and market.
func (o Offer) Key() string {
	market := "on-demand"
	if o.Spot {
		market = "spot"
	}
	return o.Provider + "/" + o.Region + "/" + o.Zone + "/" + o.InstanceType + "/" + market
}

// PricePerGPUHour is the price of one GPU-hour on this offer, the rate
// billing charges for cloud and lease GPUs.
func (o Offer) PricePerGPUHour() billing.Amount {
	if o.GPUs <= 0 {
		return o.PricePerHour
	}
	return o.PricePerHour.MulDiv(1, int64(o.GPUs))
}

// CreateRequest asks a provider for one machine.
type CreateRequest struct {
	// RecordID is the broker's id for this machine. Create is idempotent on
	// it, and the machine carries it as a tag.
	RecordID string `json:"recordId"`
	// Offer is what to launch; one of the provider's offers.
	Offer Offer `json:"offer"`
	// Tags are extra labels (team, job, …) put on the machine. Keys match
	// TagKeyPattern; values are at most 63 characters.
	Tags map[string]string `json:"tags,omitempty"`
	// UserData is an optional cloud-init document run on first boot, after
	// the provider's own cloud-config (which installs SSHAuthorizedKey).
	UserData string `json:"userData,omitempty"`
	// SSHAuthorizedKey is the broker's public key in authorized_keys form;
	// the machine lets it log in as the provider's SSH user.
	SSHAuthorizedKey string `json:"sshAuthorizedKey"`
	// Placement, when set, puts the machine in the provider's placement
	// group of that name (EC2 placement group, strategy cluster; GCE
	// compact placement resource policy), created on first use: the
	// members of a gang share one. Names match PlacementPattern.
	Placement string `json:"placement,omitempty"`
}

// PlacementPattern is what a placement group name looks like (valid as an
// EC2 group name and a GCE resource name).
var PlacementPattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,61}[a-z0-9]$`)

// Placer is a provider with placement groups: DeletePlacement removes one
// once its machines are gone (nil when it does not exist).
type Placer interface {
	DeletePlacement(ctx context.Context, name string) error
}

// TagKeyPattern is what a CreateRequest tag key looks like. It is the
// intersection of what EC2 tags, GCE labels and Lambda tags accept.
var TagKeyPattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,30}$`)

var recordIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$`)

// Validate checks what every provider needs from a request.
func (r CreateRequest) Validate() error {
	if !recordIDPattern.MatchString(r.RecordID) {
		return fmt.Errorf("recordId %q: want 1-48 letters, digits, '-' or '_': %w", r.RecordID, ErrInvalidRequest)
	}
	if r.Placement != "" && !PlacementPattern.MatchString(r.Placement) {
		return fmt.Errorf("placement %q: want 2-63 lower-case letters, digits or '-', starting with a letter: %w", r.Placement, ErrInvalidRequest)
	}
	if r.Offer.InstanceType == "" {
		return fmt.Errorf("offer.instanceType: required: %w", ErrInvalidRequest)
	}
	for k, v := range r.Tags {
		if ReservedTag(k) {
			return fmt.Errorf("tags.%s: reserved for the provider: %w", k, ErrInvalidRequest)
		}
		if !TagKeyPattern.MatchString(k) {
			return fmt.Errorf("tags.%s: key must match %s: %w", k, TagKeyPattern, ErrInvalidRequest)
		}
		if len(v) > 63 {
			return fmt.Errorf("tags.%s: value longer than 63 characters: %w", k, ErrInvalidRequest)
		}
	}
	if r.SSHAuthorizedKey != "" {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(r.SSHAuthorizedKey)); err != nil {
			return fmt.Errorf("sshAuthorizedKey: %v: %w", err, ErrInvalidRequest)
		}
	}
	return nil
}

// State is where a machine is in its life, as the provider reports it.
type State string

// Machine states. Every provider maps its own vocabulary onto these four.
const (
	StatePending    State = "pending"
	StateRunning    State = "running"
	StateStopping   State = "stopping"
	StateTerminated State = "terminated"
)

// Instance is one machine as the provider sees it.
type Instance struct {
	// ID is the provider's id ("i-0abc…", "us-central1-a/spw-…", a Lambda
	// instance id, a pool host name).
	ID           string `json:"id"`
	RecordID     string `json:"recordId"`
	Provider     string `json:"provider"`
	Region       string `json:"region"`
	Zone         string `json:"zone,omitempty"`
	InstanceType string `json:"instanceType"`
	Spot         bool   `json:"spot"`
	State        State  `json:"state"`
	// SSHHost is "host:port"; empty until the machine has an address.
	SSHHost string `json:"sshHost,omitempty"`
	// SSHUser is the login the bootstrap uses.
	SSHUser    string            `json:"sshUser,omitempty"`
	LaunchedAt time.Time         `json:"launchedAt"`
	Tags       map[string]string `json:"tags,omitempty"`
	// LeaseEnds is when a leased machine must be given back; nil for
	// clouds. The broker drains it before then.
	LeaseEnds *time.Time `json:"leaseEnds,omitempty"`
}
