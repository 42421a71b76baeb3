// Package report builds the broker's observability answers: the explain
// walk of one job (its state, queue, team, cluster, cards and last exit,
// then a verdict), the utilisation report and the delivery report with
// the cost of units of output.
//
// It reads the broker's in-memory view only through View, handed out by
// a Source for as long as one function runs, and the store through
// broker's typed records, outside that hold. What it computes from those
// inputs is plain functions over values: the verdicts, the steps, the
// sums. It never imports broker/server; the server's routes parse,
// authorise, call Reports and write the answer.
package report

import (
	"iter"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/sched"
)

// View is the broker's in-memory view as the reports read it: the jobs
// that are not terminal, the pending reasons the last scheduling cycle
// gave them, and the nodes with their cards.
//
// A View is valid only inside the function Source.Read calls, while its
// owner holds it still (the server holds its lock). Nothing it returns may
// be changed or kept past that function: jobs and nodes belong to the
// broker, which replaces them whole and never changes them in place.
type View interface {
	// Job returns the non-terminal job id.
	Job(id string) (*broker.Job, bool)
	// Jobs yields every non-terminal job, in no particular order.
	Jobs() iter.Seq[*broker.Job]
	// Reason returns the latest pending reason of a pending job.
	Reason(id string) (sched.Reason, bool)
	// Nodes returns every node with its cards, the jobs holding each card
	// and its latest telemetry, sorted by name.
	Nodes() []api.NodeView
}

// Source hands out the View. Read calls fn once, with a View that holds
// still until fn returns; fn does no I/O and does not wait on anything,
// since the broker's writers wait for it.
type Source interface {
	Read(fn func(View))
}

// Reports builds the answers of one request over a broker's view and
// store.
type Reports struct {
	Store  broker.Store
	Source Source
	Clock  clock.Clock
	// Config is the configuration in force when the request came.
	Config *config.Config
}
