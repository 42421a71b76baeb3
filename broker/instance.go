package broker

import (
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker/slurm"
	"github.com/spillway-dev/spillway/providers"
)

// InstanceRecord is the broker's record of one burst machine, written
// before every external call that concerns it, so that a broker killed at
// any moment resumes each machine where it was and never loses one.
type InstanceRecord struct {
	// ID is the broker's record id: the provider's idempotency key (client
	// token) and the machine's record tag, and the agent's node name.
	ID       string          `json:"id"`
	Provider string          `json:"provider"`
	Offer    providers.Offer `json:"offer"`
	// Fallbacks are the offers still to try if the provider has no
	// capacity for Offer.
	Fallbacks []providers.Offer `json:"fallbacks,omitempty"`
	State     MachineState      `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	// ProviderID is the provider's id once Create answered.
	ProviderID string `json:"providerId,omitempty"`
	SSHHost    string `json:"sshHost,omitempty"`
	SSHUser    string `json:"sshUser,omitempty"`
	// Team, Queue and Jobs are the demand the machine was started for;
	// Jobs also gains the jobs bound to it later.
	Team  string   `json:"team"`
	Queue string   `json:"queue"`
	Jobs  []string `json:"jobs,omitempty"`
	// Group names the gang launch the machine belongs to (its first
	// member's record id) and GroupSize counts its members: a gang's
	// machines are one offer in one zone and one placement group, started
	// and given up together. Empty for a machine launched alone.
	Group     string `json:"group,omitempty"`
	GroupSize int    `json:"groupSize,omitempty"`
	// ProjectedCost was reserved against the budgets at launch.
	ProjectedCost billing.Amount `json:"projectedCost"`
	// TokenSHA256 is the hash of the machine's own agent token, valid only
	// while the machine lives.
	TokenSHA256 string `json:"tokenSha256,omitempty"`

	CreatedAt    time.Time  `json:"createdAt"`
	LaunchedAt   *time.Time `json:"launchedAt,omitempty"`
	ReadyAt      *time.Time `json:"readyAt,omitempty"`
	IdleSince    *time.Time `json:"idleSince,omitempty"`
	LastSeen     *time.Time `json:"lastSeen,omitempty"` // in the provider's list
	TerminatedAt *time.Time `json:"terminatedAt,omitempty"`

	// Bootstrap is the transcript of the SSH bootstrap (JSON as the
	// bootstrap package writes it).
	Bootstrap json.RawMessage `json:"bootstrap,omitempty"`
	// Attempts counts Create calls, Deletes counts Delete calls.
	Attempts int `json:"attempts"`
	Deletes  int `json:"deletes"`
	// History is every state change with its time and reason.
	History []Transition `json:"history"`

	// Reclaim is the provider's interruption notice for the machine (spot
	// reclaim, GCE preemption), once its agent read one: the machine is
	// ending, and the ledger closes it no later than Reclaim.At.
	Reclaim *Reclaim `json:"reclaim,omitempty"`

	// SlurmNode is the Slurm node the machine is (spillway slurm resume);
	// empty for the burst controller's own machines. Slurm, not the
	// burst decision, ends such a machine (spillway slurm suspend).
	SlurmNode string `json:"slurmNode,omitempty"`
	// SlurmJobs are the Slurm jobs seen running on the node (squeue), for
	// the ledger's usage lines.
	SlurmJobs []slurm.Job `json:"slurmJobs,omitempty"`
}

// MachineState is where a burst machine is in its life.
type MachineState string

// Machine states, in order. Each is persisted before the next external
// call.
const (
	MachineRequested     MachineState = "requested"
	MachineProvisioning  MachineState = "provisioning"
	MachineBootstrapping MachineState = "bootstrapping"
	MachineReady         MachineState = "ready"
	MachineDraining      MachineState = "draining"
	MachineTerminating   MachineState = "terminating"
	MachineTerminated    MachineState = "terminated"
	MachineFailed        MachineState = "failed"
)

// InFlight reports whether the machine is on its way up.
func (s MachineState) InFlight() bool {
	return s == MachineRequested || s == MachineProvisioning || s == MachineBootstrapping
}

// Ended reports whether the machine is gone.
func (s MachineState) Ended() bool { return s == MachineTerminated || s == MachineFailed }

// Going reports whether the controller is ending the machine or has.
func (s MachineState) Going() bool {
	return s == MachineDraining || s == MachineTerminating || s.Ended()
}

// Clone copies a record so a change can be built and written before it
// replaces the one in memory.
func (r *InstanceRecord) Clone() *InstanceRecord {
	c := *r
	c.History = slices.Clone(r.History)
	c.Jobs = slices.Clone(r.Jobs)
	c.Fallbacks = slices.Clone(r.Fallbacks)
	return &c
}

// Transit records a state change.
func (r *InstanceRecord) Transit(at time.Time, to MachineState, reason, detail string) {
	r.History = append(r.History, Transition{At: at, From: State(r.State), To: State(to), Reason: reason, Detail: detail})
	r.State = to
}

// GetInstance reads one record.
func GetInstance(tx Tx, id string) (*InstanceRecord, error) {
	var r InstanceRecord
	if err := getJSON(tx, BucketInstances, id, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// PutInstance writes one record.
func PutInstance(tx Tx, r *InstanceRecord) error { return putJSON(tx, BucketInstances, r.ID, r) }

// ListInstances returns every record, oldest first.
func ListInstances(tx Tx) ([]*InstanceRecord, error) {
	var out []*InstanceRecord
	err := tx.Scan(BucketInstances, "", "", func(_ string, v []byte) error {
		var r InstanceRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		out = append(out, &r)
		return nil
	})
	return out, err
}

const tokenIndex = "agent-token/"

// PutInstanceToken indexes a machine's token hash to its record.
func PutInstanceToken(tx Tx, sha, id string) error {
	return tx.Put(BucketInstances+"-tokens", tokenIndex+sha, []byte(id))
}

// DeleteInstanceToken revokes a machine's token.
func DeleteInstanceToken(tx Tx, sha string) error {
	if sha == "" {
		return nil
	}
	return tx.Delete(BucketInstances+"-tokens", tokenIndex+sha)
}

// InstanceByToken finds the live machine a token hash belongs to.
func InstanceByToken(tx Tx, sha string) (*InstanceRecord, error) {
	id, err := tx.Get(BucketInstances+"-tokens", tokenIndex+sha)
	if err != nil {
		return nil, err
	}
	r, err := GetInstance(tx, string(id))
	if errors.Is(err, ErrNotFound) {
		return nil, ErrNotFound
	}
	return r, err
}

// Reclaim is a provider's notice that it takes a burst machine back.
type Reclaim struct {
	// Kind is the agent's notice kind (spot_interruption, preempted).
	Kind   string `json:"kind"`
	Action string `json:"action,omitempty"`
	// At is when the provider takes the machine; SeenAt when the agent
	// read the notice.
	At     time.Time `json:"at"`
	SeenAt time.Time `json:"seenAt"`
}
