package broker

import "context"

// LeaderStatus is what a leader election knows at one moment.
type LeaderStatus struct {
	// Leader: this broker holds an unexpired lease, won with fencing
	// token Token (0 when not leader). Writes made as leader carry the
	// token (see Fenced).
	Leader bool
	Token  uint64
	// LeaderID and LeaderURL name the lease holder as last seen, this
	// broker included ("" when none is known). Standbys redirect writes
	// to LeaderURL.
	LeaderID  string
	LeaderURL string
	// Err is the last error reaching the election's backend (the store),
	// nil while it answers.
	Err error
}

// Elector is a leader election among the brokers sharing one store. The
// Redis store's elector implements it; with the embedded store there is
// no election (the one broker always leads).
type Elector interface {
	// Run campaigns and renews until ctx ends, then gives the lease up.
	Run(ctx context.Context)
	// Status is the current view. Leader turns false the moment the lease
	// can no longer be trusted, even before Run notices.
	Status() LeaderStatus
	// Changes receives a value (coalesced) when Status changes.
	Changes() <-chan struct{}
}
