package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// flakyBroker serves one job whose log is "line 1\nline 2\nline 3\n".
// The first log stream sends line 1 and then the connection drops, as
// when the broker is killed; the next job read fails with 503 (the broker
// restarting); after that everything works and the job has succeeded.
func flakyBroker(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var logCalls, jobCalls atomic.Int32
	const id = "01M8RYGE2896ABCDEFGHJKMNPQ"
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/jobs/"+id, func(w http.ResponseWriter, r *http.Request) {
		n := jobCalls.Add(1)
		state := broker.StateRunning
		switch {
		case n == 2:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"starting"}}`))
			return
		case logCalls.Load() >= 2:
			state = broker.StateSucceeded
		}
		_ = json.NewEncoder(w).Encode(broker.Job{ID: id, State: state,
			History: []broker.Transition{{To: state, Detail: "exit code 0"}}})
	})
	mux.HandleFunc("/v1/jobs/"+id+"/logs", func(w http.ResponseWriter, r *http.Request) {
		if logCalls.Add(1) == 1 {
			w.Header().Set("Content-Length", "100")
			_, _ = w.Write([]byte("line 1\n"))
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		_, _ = w.Write([]byte("line 1\nline 2\nline 3\n"))
	})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs, &jobCalls
}

// TestLogsFollowReconnects: `logs -f` survives the broker going away
// mid-stream: it says so once, says the job keeps running, reconnects
// with backoff and shows every line exactly once.
func TestLogsFollowReconnects(t *testing.T) {
	old := reconnectBackoff
	reconnectBackoff.initial, reconnectBackoff.max = time.Millisecond, 5*time.Millisecond
	t.Cleanup(func() { reconnectBackoff = old })
	hs, _ := flakyBroker(t)
	var out, errOut bytes.Buffer
	code := execute([]string{"--server", hs.URL, "--token", "t", "logs", "-f", "01M8RYGE2896ABCDEFGHJKMNPQ"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if out.String() != "line 1\nline 2\nline 3\n" {
		t.Fatalf("log shown %q", out.String())
	}
	for _, want := range []string{"lost the broker", "keeps running", "reconnected"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	if strings.Count(errOut.String(), "lost the broker") != 1 {
		t.Errorf("the outage was reported more than once:\n%s", errOut.String())
	}
}

// TestInterruptExits130: Ctrl-C while `run --wait` waits ends the CLI
// with 130 and no "context canceled" error text.
func TestInterruptExits130(t *testing.T) {
	var polled atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		polled.Add(1)
		_ = json.NewEncoder(w).Encode(broker.Job{ID: "01M8RYGE2896ABCDEFGHJKMNPQ", State: broker.StatePending,
			Pending: &broker.PendingReason{Code: "resources", Message: "waiting for 1 GPU"}})
	}))
	t.Cleanup(hs.Close)
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- execute([]string{"--server", hs.URL, "--token", "t", "run", "--wait", "--", "true"}, &out, &errOut)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for polled.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 130 {
			t.Fatalf("exit %d, want 130; stderr:\n%s", code, errOut.String())
		}
		if strings.Contains(errOut.String(), "context canceled") {
			t.Fatalf("stderr shows the context error:\n%s", errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run --wait did not stop on SIGINT")
	}
}

// TestRunWaitReconnectsQuietly: `run --wait` prints a countdown pending
// reason once, not once per poll (the minimum wait ticks every second);
// when the broker goes away (a 503 while it restarts, then a dropped
// connection) it says so once, says the job keeps running, reconnects
// with backoff, then shows the log and exits with the job's status.
func TestRunWaitReconnectsQuietly(t *testing.T) {
	old := reconnectBackoff
	reconnectBackoff.initial, reconnectBackoff.max = time.Millisecond, 5*time.Millisecond
	t.Cleanup(func() { reconnectBackoff = old })
	const id = "01M8RYGE2896ABCDEFGHJKMNPQ"
	var reads atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		j := broker.Job{ID: id, State: broker.StatePending}
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/jobs":
			w.WriteHeader(http.StatusCreated)
		case r.URL.Path == "/v1/jobs/"+id+"/logs":
			_, _ = w.Write([]byte("hello\n"))
			return
		case r.URL.Path == "/v1/jobs/"+id:
			switch n := reads.Add(1); {
			case n <= 3:
				j.Pending = &broker.PendingReason{Code: "burst_wait", Message: fmt.Sprintf("waiting %ds of the 60s minimum before bursting", 60-n)}
			case n == 4:
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":{"code":"unavailable","message":"starting"}}`))
				return
			case n == 5:
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			case n == 6:
				j.State = broker.StateRunning
			default:
				j.State = broker.StateSucceeded
				j.History = []broker.Transition{{To: broker.StateSucceeded, Detail: "exit code 0"}}
			}
		default:
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(j)
	}))
	t.Cleanup(hs.Close)
	var out, errOut bytes.Buffer
	code := execute([]string{"--server", hs.URL, "--token", "t", "run", "--no-upload", "--wait", "--", "true"}, &out, &errOut)
	if code != 0 || out.String() != "hello\n" {
		t.Fatalf("exit %d, stdout %q\nstderr:\n%s", code, out.String(), errOut.String())
	}
	stderr := errOut.String()
	if n := strings.Count(stderr, "minimum before bursting"); n != 1 {
		t.Errorf("the countdown was printed %d times, want once:\n%s", n, stderr)
	}
	for _, want := range []string{"lost the broker", "job " + id + " keeps running", "reconnected", id + " succeeded: exit code 0"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if n := strings.Count(stderr, "lost the broker"); n != 1 {
		t.Errorf("one outage reported %d times:\n%s", n, stderr)
	}
}
