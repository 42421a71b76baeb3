package agent

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/agent/imdsmock"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// waitFor polls cond until it holds (no timing assertion: the bound only
// ends a hung test).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fakeBroker) lastNotices() []agentapi.Notice {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last.Notices
}

// TestSpotNoticeFromEC2MetadataMock: a job runs on a spot machine whose
// metadata server (the real amazon-ec2-metadata-mock, IMDSv2 only) starts
// serving an interruption notice. The agent reads it with a session
// token, sends the job its checkpoint signal, reports the notice with the
// announced reclaim time, and starts nothing more.
func TestSpotNoticeFromEC2MetadataMock(t *testing.T) {
	defer func(d time.Duration) { ec2NoticeEvery = d }(ec2NoticeEvery)
	ec2NoticeEvery = 50 * time.Millisecond
	addr := imdsmock.FreeAddr(t) // nothing listens yet: no notice, a warning
	r := newRigWith(t, func(c *Config) {
		c.Notice = &agentapi.NoticeWatch{Provider: "aws", Endpoint: "http://" + addr}
	})
	r.assign("spot", 0, time.Hour, "sh", "-c", "trap 'echo checkpoint-signal; exit 0' TERM; echo started; while :; do sleep 0.05; done")
	waitFor(t, "the job to run", func() bool {
		rep, ok := r.fb.report("spot")
		return ok && rep.State == agentapi.RunRunning && rep.LogSize > 0
	})
	if n := r.ag.Notices(); len(n) != 0 {
		t.Fatalf("notices before the metadata server said anything: %+v", n)
	}
	reclaim := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	imdsmock.Start(t, imdsmock.Options{Addr: addr, Time: reclaim})

	rep := r.waitEnded("spot", 2*time.Minute)
	if rep.Reason != agentapi.ReasonSpotReclaim || rep.ExitCode != 0 {
		t.Fatalf("job ended %+v, want a clean exit after its checkpoint signal (reason spot_reclaim)", rep)
	}
	r.fb.mu.Lock()
	log := string(r.fb.logs[agentapi.JobRef{Job: "spot", Attempt: 1}])
	r.fb.mu.Unlock()
	if !strings.Contains(log, "checkpoint-signal") {
		t.Fatalf("the job did not get its checkpoint signal; its log: %q", log)
	}
	var got agentapi.Notice
	waitFor(t, "the notice in a heartbeat", func() bool {
		for _, n := range r.fb.lastNotices() {
			if n.Kind == agentapi.NoticeSpotInterruption {
				got = n
				return true
			}
		}
		return false
	})
	if got.Action != "terminate" || !got.ReclaimAt.Equal(reclaim) {
		t.Fatalf("notice %+v, want terminate at %s", got, reclaim)
	}
	waitFor(t, "the rebalance recommendation", func() bool {
		for _, n := range r.ag.Notices() {
			if n.Kind == agentapi.NoticeRebalance {
				return true
			}
		}
		return false
	})

	// Nothing new starts on a machine being reclaimed.
	r.assign("late", 1, time.Hour, "true")
	r.fb.mu.Lock()
	from := r.fb.syncs
	r.fb.mu.Unlock()
	waitFor(t, "three more heartbeats", func() bool {
		r.fb.mu.Lock()
		defer r.fb.mu.Unlock()
		return r.fb.syncs >= from+3
	})
	if rep, ok := r.fb.report("late"); ok {
		t.Fatalf("a job started on a machine being reclaimed: %+v", rep)
	}
}

// gceMetadata is a stub of the GCE metadata server's instance/preempted,
// as Google documents it ("Getting VM metadata" and "Detect if a VM was
// preempted", cloud.google.com/compute/docs/metadata/querying-metadata):
// requests must carry Metadata-Flavor: Google (else 403); answers carry
// Metadata-Flavor: Google and an ETag; with wait_for_change=true the
// answer is held until the value's ETag differs from last_etag (or
// timeout_sec passes, answering the unchanged value). The value is FALSE
// until the VM is preempted, then TRUE.
type gceMetadata struct {
	mu        sync.Mutex
	preempted bool
	changed   chan struct{}
	waits     int
}

func newGCEMetadata() *gceMetadata { return &gceMetadata{changed: make(chan struct{})} }

func (g *gceMetadata) preempt() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.preempted = true
	close(g.changed)
}

func (g *gceMetadata) value() (string, string, chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.preempted {
		return "TRUE", "etag-true", g.changed
	}
	return "FALSE", "etag-false", g.changed
}

func (g *gceMetadata) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	if r.URL.Path != "/computeMetadata/v1/instance/preempted" {
		http.NotFound(w, r)
		return
	}
	v, etag, changed := g.value()
	q := r.URL.Query()
	if q.Get("wait_for_change") == "true" && (q.Get("last_etag") == "" || q.Get("last_etag") == etag) {
		g.mu.Lock()
		g.waits++
		g.mu.Unlock()
		secs, _ := strconv.Atoi(q.Get("timeout_sec"))
		select {
		case <-changed:
		case <-time.After(time.Duration(max(secs, 1)) * time.Second):
		case <-r.Context().Done():
			return
		}
		v, etag, _ = g.value()
	}
	w.Header().Set("Metadata-Flavor", "Google")
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Type", "application/text")
	_, _ = w.Write([]byte(v))
}

// TestGCEPreemptedNotice: the agent holds instance/preempted open with
// wait_for_change; when the VM is preempted it reports the notice with
// the 30-second reclaim GCE gives, and stops its job.
func TestGCEPreemptedNotice(t *testing.T) {
	md := newGCEMetadata()
	srv := httptest.NewServer(md)
	t.Cleanup(srv.Close)
	r := newRigWith(t, func(c *Config) { c.Notice = &agentapi.NoticeWatch{Provider: "gcp", Endpoint: srv.URL} })
	r.assign("pre", 0, time.Hour, "sh", "-c", "echo started; while :; do sleep 0.05; done")
	waitFor(t, "the job to run and the agent to wait on the metadata server", func() bool {
		rep, ok := r.fb.report("pre")
		md.mu.Lock()
		defer md.mu.Unlock()
		return ok && rep.State == agentapi.RunRunning && rep.LogSize > 0 && md.waits > 0
	})
	if n := r.ag.Notices(); len(n) != 0 {
		t.Fatalf("notices before preemption: %+v", n)
	}
	md.preempt()
	rep := r.waitEnded("pre", 2*time.Minute)
	if rep.Reason != agentapi.ReasonSpotReclaim {
		t.Fatalf("job ended %+v, want reason spot_reclaim", rep)
	}
	n := r.ag.Notices()
	if len(n) != 1 || n[0].Kind != agentapi.NoticePreempted || n[0].ReclaimAt.Sub(n[0].SeenAt) != gcePreemptNotice {
		t.Fatalf("notices %+v, want one preempted notice 30s ahead", n)
	}
}

// logCounter counts log records by message.
type logCounter struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs[r.Message]++
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

func (l *logCounter) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for m, c := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n += c
		}
	}
	return n
}

// TestMetadataUnreachableNoFalseAlarm: a metadata endpoint that does not
// answer (EC2) or answers without Metadata-Flavor (not GCE's server) is
// one warning for the whole outage, and never a notice.
func TestMetadataUnreachableNoFalseAlarm(t *testing.T) {
	defer func(d time.Duration) { ec2NoticeEvery = d }(ec2NoticeEvery)
	ec2NoticeEvery = 10 * time.Millisecond
	impostor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("TRUE")) // no Metadata-Flavor: not the metadata server
	}))
	t.Cleanup(impostor.Close)
	for _, w := range []agentapi.NoticeWatch{
		{Provider: "aws", Endpoint: "http://" + imdsmock.FreeAddr(t)},
		{Provider: "gcp", Endpoint: impostor.URL},
	} {
		t.Run(w.Provider, func(t *testing.T) {
			logs := &logCounter{msgs: map[string]int{}}
			ag := &Agent{cfg: Config{Notice: &w}, log: slog.New(logs), now: time.Now, runs: map[agentapi.JobRef]*run{},
				wakeCh: make(chan struct{}, 1)}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); ag.watchNotices(ctx) }()
			waitFor(t, "several failed reads", func() bool {
				ag.notice.mu.Lock()
				defer ag.notice.mu.Unlock()
				return ag.notice.unreachable >= 3
			})
			cancel()
			<-done
			if n := ag.Notices(); len(n) != 0 {
				t.Fatalf("false alarm: %+v", n)
			}
			if c := logs.count("interruption notices cannot be read"); c != 1 {
				t.Fatalf("%d warnings for one outage, want 1", c)
			}
		})
	}
}
