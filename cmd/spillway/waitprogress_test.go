package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// TestWaitProgressShowsBootstrapSteps: while `run --wait` waits for a
// burst machine it prints each step once, in order, as the polls see them:
// requested, created, booted, the host key verified, each upload and the
// agent start from the bootstrap transcript, then registered.
func TestWaitProgressShowsBootstrapSteps(t *testing.T) {
	var out bytes.Buffer
	p := &waitProgress{w: &out, machine: "spw-1"}
	rec := &broker.InstanceRecord{ID: "spw-1"}
	add := func(to, reason, detail string) {
		rec.History = append(rec.History, broker.Transition{To: broker.State(to), Reason: reason, Detail: detail})
	}
	add("requested", "requested", "local-ec2 g5.xlarge for 1 waiting job(s)")
	p.instance(rec)
	add("provisioning", "created", "local-ec2 i-1")
	p.instance(rec)
	p.instance(rec) // a poll that sees nothing new prints nothing
	tr, err := json.Marshal(bootstrap.Transcript{HostKey: "SHA256:abc", Steps: []bootstrap.Step{
		{Name: "connect"}, {Name: "upload binary", Duration: time.Second}, {Name: "upload config"},
		{Name: "start agent (supervised)"}, {Name: "register"}}})
	if err != nil {
		t.Fatal(err)
	}
	rec.Bootstrap = tr
	add("bootstrapping", "running", "reachable at 127.0.0.1:22")
	add("ready", "registered", "agent registered after 3s")
	p.instance(rec)
	p.instance(rec)
	want := []string{
		"spillway: burst spw-1: requested: local-ec2 g5.xlarge for 1 waiting job(s)",
		"spillway: burst spw-1: provisioning: created local-ec2 i-1",
		"spillway: burst spw-1: bootstrapping: booted, reachable at 127.0.0.1:22",
		"spillway: burst spw-1: host key SHA256:abc verified against the provider",
		"spillway: burst spw-1: upload binary: ok (1s)",
		"spillway: burst spw-1: upload config: ok (0s)",
		"spillway: burst spw-1: start agent (supervised): ok (0s)",
		"spillway: burst spw-1: ready: agent registered after 3s",
	}
	if got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("printed:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
}
