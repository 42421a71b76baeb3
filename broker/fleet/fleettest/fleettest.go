// Package fleettest is a fake of the broker a fleet works for
// (fleet.Broker, and slurmdoor.Broker): a store in memory and a few nodes,
// enough for broker/fleet and broker/slurmdoor to be tested without a
// server.
package fleettest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/burstctl"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/providers"
)

// Broker has no jobs; its nodes are Nodes, its store Store. Lock it as the
// fleet does (the embedded mutex).
type Broker struct {
	sync.Mutex
	Store broker.Store
	Nodes map[string]*broker.Node
	// Dropped are the nodes Commit dropped, in order.
	Dropped []string
	// Reasons are the last NoteReasons.
	Reasons map[string]broker.PendingReason
	// OnSlurmBootstrap and OnSlurmDown, when set, are the Slurm hooks (the
	// door's); without them Slurm bootstraps fail.
	OnSlurmBootstrap func(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error
	OnSlurmDown      func(ctx context.Context, node, reason string)

	work sync.WaitGroup
	ids  int
}

// New is a Broker over an empty store in memory.
func New() *Broker {
	return &Broker{Store: broker.NewMemStore(), Nodes: map[string]*broker.Node{}}
}

func (b *Broker) MayDecide() bool                                 { return true }
func (b *Broker) Job(string) *broker.Job                          { return nil }
func (b *Broker) Waiting() []burstctl.Waiting                     { return nil }
func (b *Broker) OnPrem() (int, int)                              { return 0, 0 }
func (b *Broker) MachineJobs(string) ([]string, int)              { return nil, 0 }
func (b *Broker) OnMachine(string) ([]*broker.Job, []*broker.Job) { return nil, nil }
func (b *Broker) HomeNodes() []burst.HomeNode                     { return nil }
func (b *Broker) WakeNode(string)                                 {}
func (b *Broker) OffersChanged()                                  {}
func (b *Broker) Kick()                                           {}
func (b *Broker) Park() func()                                    { return func() {} }
func (b *Broker) BrokerCA() string                                { return "" }
func (b *Broker) AgentRuntime(string) *jobrt.Config               { return &jobrt.Config{} }

func (b *Broker) SlurmBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	if b.OnSlurmBootstrap == nil {
		return fmt.Errorf("no slurm here")
	}
	return b.OnSlurmBootstrap(ctx, rec, prov)
}

func (b *Broker) SlurmDown(ctx context.Context, node, reason string) {
	if b.OnSlurmDown != nil {
		b.OnSlurmDown(ctx, node, reason)
	}
}

func (b *Broker) Node(name string) (*broker.Node, bool) {
	n, ok := b.Nodes[name]
	return n, ok
}

func (b *Broker) NoteReasons(r map[string]broker.PendingReason) { b.Reasons = r }

func (b *Broker) NewRecordID(time.Time) string {
	b.ids++
	return fmt.Sprintf("spw-%d", b.ids)
}

// Commit writes the jobs, tx and the dropped nodes in one transaction,
// then forgets the nodes.
func (b *Broker) Commit(ctx context.Context, jobs []*broker.Job, dropNodes []string, tx func(broker.Tx) error) error {
	err := b.Store.Update(ctx, func(t broker.Tx) error {
		for _, j := range jobs {
			if err := broker.PutJob(t, j); err != nil {
				return err
			}
		}
		if tx != nil {
			if err := tx(t); err != nil {
				return err
			}
		}
		for _, n := range dropNodes {
			if err := t.Delete(broker.BucketNodes, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range dropNodes {
		delete(b.Nodes, n)
		b.Dropped = append(b.Dropped, n)
	}
	return nil
}

// Go runs fn on its own goroutine; Wait waits for every one to return.
func (b *Broker) Go(fn func(ctx context.Context)) {
	b.work.Add(1)
	go func() {
		defer b.work.Done()
		fn(context.Background())
	}()
}

// Wait waits for the goroutines Go started.
func (b *Broker) Wait() { b.work.Wait() }
