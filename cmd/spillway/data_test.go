package main

import (
	"testing"

	"github.com/spillway-dev/spillway/broker"
)

func TestDataLine(t *testing.T) {
	j := &broker.Job{Attempt: 2, Data: &broker.JobData{Attempt: 2, Phase: "inputs", Done: 3_100_000_000, Total: 10_000_000_000}}
	if got := dataLine(j); got != "staging inputs 3.1/10.0 GB" {
		t.Fatalf("got %q", got)
	}
	j.Data = &broker.JobData{Attempt: 2, Phase: "running", Restored: "00000000000000000007", InputBytes: 10e9, CacheHitBytes: 8e9,
		Error: "bad\x1b[31m"}
	if got := dataLine(j); got != "resumed from checkpoint 00000000000000000007; inputs 10.0 GB (8.0 GB from the node cache); error: bad[31m" {
		t.Fatalf("got %q", got)
	}
	j.Attempt = 3 // the record is of an earlier attempt
	if got := dataLine(j); got != "" {
		t.Fatalf("got %q", got)
	}
}
