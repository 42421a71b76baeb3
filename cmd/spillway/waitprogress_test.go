package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/client"
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

// TestWaitProgressDoneWaitsForRegistration: the job may leave the queue
// (its agent registered and took it) before the broker has recorded the
// machine's registration; done polls the record until it shows it, so
// the bootstrap steps and "registered" are still printed.
func TestWaitProgressDoneWaitsForRegistration(t *testing.T) {
	tr, err := json.Marshal(bootstrap.Transcript{HostKey: "SHA256:abc", Steps: []bootstrap.Step{{Name: "upload binary"}}})
	if err != nil {
		t.Fatal(err)
	}
	var polls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/instances/spw-1" {
			http.NotFound(w, r)
			return
		}
		rec := &broker.InstanceRecord{ID: "spw-1", State: broker.MachineBootstrapping, Bootstrap: tr,
			History: []broker.Transition{{To: "bootstrapping", Reason: "running", Detail: "reachable at 127.0.0.1:22"}}}
		if polls.Add(1) >= 3 { // the launch worker records the registration
			rec.State = broker.MachineReady
			rec.History = append(rec.History, broker.Transition{To: "ready", Reason: "registered", Detail: "agent registered after 1s"})
		}
		_ = json.NewEncoder(w).Encode(api.InstanceView{InstanceRecord: rec})
	}))
	defer srv.Close()
	var out bytes.Buffer
	p := &waitProgress{w: &out, machine: "spw-1"}
	p.done(context.Background(), client.New(srv.URL, "tok"))
	for _, want := range []string{"bootstrapping: booted", "host key SHA256:abc verified", "upload binary: ok", "ready: agent registered after 1s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("done printed no %q:\n%s", want, out.String())
		}
	}
	if n := polls.Load(); n != 3 {
		t.Errorf("%d polls, want 3 (stop once registered)", n)
	}
}
