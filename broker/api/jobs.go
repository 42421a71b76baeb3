package api

import "github.com/spillway-dev/spillway/broker"

// JobList is the body of GET /v1/jobs.
type JobList struct {
	Jobs []*broker.Job `json:"jobs"`
	// Next is the cursor for the following page, "" on the last.
	Next string `json:"next,omitempty"`
	// Arrays, when the listing folds arrays (foldArrays=true), sum up
	// by array id the waiting elements a listed one stands for, itself
	// included: the others are not listed, as squeue shows an array's
	// waiting elements on one line.
	Arrays map[string]ArrayView `json:"arrays,omitempty"`
}

// Whoami is the body of GET /v1/whoami.
type Whoami struct {
	Principal
	Version string `json:"version"`
	// Priorities and Teams are the config's, for the CLI's completion.
	Priorities []string `json:"priorities,omitempty"`
	Teams      []string `json:"teams,omitempty"`
}
