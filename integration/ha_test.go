package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/broker/redis"
)

// HA test timing: a short lease keeps the suite fast.
const (
	haTTL   = 2 * time.Second
	haRenew = 500 * time.Millisecond
)

// haBroker is one broker process of an HA cluster.
type haBroker struct {
	id, addr, url, config string
	p                     *proc
}

// haCluster is three brokers sharing one Redis (a key prefix of their
// own), agents, and a file where every job start is recorded.
type haCluster struct {
	*cluster
	store string
	// suffix makes node names (and so the simulated GPUs' UUIDs) unique:
	// the agent's leak cleanup kills any process it sees on its cards, and
	// other test runs on this host simulate cards too.
	suffix  string
	brokers []*haBroker
	starts  string
	release string
}

func newHACluster(t *testing.T) *haCluster {
	t.Helper()
	return newHAClusterOn(t, "127.0.0.1:6379", 3)
}

// newHAClusterOn is newHACluster with n brokers on the Redis at addr.
func newHAClusterOn(t *testing.T, addr string, n int) *haCluster {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	store := "redis://" + addr + "/0?prefix=spillway-it-" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rs, err := redis.Open(ctx, store, redis.Options{})
	if err != nil {
		msg := "start redis-server on 127.0.0.1:6379 (apt-get install -y redis-server): " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() {
		rs.Wipe(context.Background())
		rs.Close()
	})
	dir := t.TempDir()
	// Jobs run as unprivileged uids when the tests run as root.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o777)
	h := &haCluster{cluster: &cluster{t: t, dir: dir, viewer: tokAdmin}, store: store, suffix: hex.EncodeToString(b[:3]),
		starts: filepath.Join(dir, "starts"), release: filepath.Join(dir, "release")}
	// Jobs outlive killed agents, as on a real crash: release them at the
	// end whatever happened.
	t.Cleanup(func() { os.WriteFile(h.release, nil, 0o600) })
	for i := 1; i <= n; i++ {
		hb := &haBroker{id: fmt.Sprintf("b%d", i), addr: freePort(t)}
		hb.url = "http://" + hb.addr
		hb.config = filepath.Join(dir, hb.id+".yaml")
		h.brokers = append(h.brokers, hb)
	}
	// One advertiseURL for all (the door, as a load balancer would be);
	// each broker's own address is its ha.peerURL, by default its listen.
	door := h.brokers[n-1].url
	for _, hb := range h.brokers {
		cfg := fmt.Sprintf(`listen: %s
advertiseURL: %s
tls: {insecure: true}
dataDir: data-%s
store: %s
ha: {brokerID: %s, leaseTTL: %s, renewInterval: %s, agentGrace: 20s}
scheduler: {interval: 200ms}
agents: {heartbeatInterval: 500ms, lostAfter: 4}
billing:
  slice: 1s
  onprem:
    rates:
      H100: [{perGPUHour: "2.00"}]
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: admin, role: operator, token: %s}
    - {name: agents, role: agent, token: %s}
`, hb.addr, door, hb.id, store, hb.id, haTTL, haRenew, tokAlice, tokAdmin, tokAgent)
		if err := os.WriteFile(hb.config, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// b1 starts first and leads; the last is the door agents and clients
	// use (a load balancer's part in a real install): it redirects to the
	// leader.
	h.startBroker(h.brokers[0])
	h.waitLeader(h.brokers[:1], 10*time.Second)
	for _, b := range h.brokers[1:] {
		h.startBroker(b)
	}
	h.url = h.brokers[n-1].url
	return h
}

func (h *haCluster) startBroker(b *haBroker) {
	h.t.Helper()
	b.p = start(h.t, "broker "+b.id, "server", "--config", b.config)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, code := health(b); code == http.StatusOK {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Fatalf("broker %s not healthy", b.id)
}

func health(b *haBroker) (*struct {
	Leader    bool   `json:"leader"`
	LeaderURL string `json:"leaderURL"`
}, int) {
	c := &http.Client{Timeout: 300 * time.Millisecond}
	resp, err := c.Get(b.url + "/healthz")
	if err != nil {
		return nil, 0
	}
	defer resp.Body.Close()
	var out struct {
		Leader    bool   `json:"leader"`
		LeaderURL string `json:"leaderURL"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return &out, resp.StatusCode
}

// waitLeader waits until one of bs leads, and returns it.
func (h *haCluster) waitLeader(bs []*haBroker, within time.Duration) *haBroker {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, b := range bs {
			if hz, code := health(b); code == http.StatusOK && hz.Leader {
				return b
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.t.Fatalf("no leader among %d brokers within %s", len(bs), within)
	return nil
}

// waitDoor waits until the door (b3) redirects to leader: a standby
// learns of a new leader at its next renewal step.
func (h *haCluster) waitDoor(leader *haBroker) {
	h.t.Helper()
	door := h.brokers[len(h.brokers)-1]
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if hz, code := health(door); code == http.StatusOK && hz.LeaderURL == leader.url {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.t.Fatalf("door %s does not know leader %s", door.id, leader.id)
}

// submit sends a job that records its start and runs until released.
func (h *haCluster) submit(cl *client.Client) string {
	h.t.Helper()
	j, err := cl.SubmitSpec(context.Background(), broker.Spec{Resources: broker.Resources{GPUs: 1}, Timeout: broker.Duration(10 * time.Minute),
		Command: []string{"sh", "-c", "echo $SPILLWAY_JOB_ID $SPILLWAY_ATTEMPT >> " + h.starts +
			"; while [ ! -e " + h.release + " ]; do sleep 0.1; done"}})
	if err != nil {
		h.t.Fatal(err)
	}
	return j.ID
}

func (h *haCluster) histories(ids []string) map[string][]broker.Transition {
	h.t.Helper()
	out := map[string][]broker.Transition{}
	for _, id := range ids {
		j, err := h.client(tokAdmin).Job(context.Background(), id)
		if err != nil {
			h.t.Fatal(err)
		}
		out[id] = j.History
	}
	return out
}

// check is what a failover must keep: every job succeeded on its first
// attempt, started exactly once (by the broker's record and by the
// agents'), its history before the failover kept as it was, and its
// ledger one unbroken run of slices from GPUs given to GPUs taken back.
func (h *haCluster) check(ids []string, before map[string][]broker.Transition) {
	t := h.t
	t.Helper()
	ctx := context.Background()
	raw, _ := os.ReadFile(h.starts)
	started := map[string]int{}
	for _, l := range lines(string(raw)) {
		started[strings.Fields(l)[0]]++
	}
	rs, err := redis.Open(ctx, h.store, redis.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	byJob := map[string][]billing.Entry{}
	if err := (broker.Ledger{Store: rs}).Scan(ctx, time.Time{}, time.Time{}, func(e billing.Entry) error {
		byJob[e.Job] = append(byJob[e.Job], e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		var j *broker.Job
		if err := rs.View(ctx, func(tx broker.Tx) error {
			var err error
			j, err = broker.GetJob(tx, id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if j.State != broker.StateSucceeded || j.Attempt != 1 {
			t.Errorf("job %s: %s after %d attempts", id, j.State, j.Attempt)
		}
		if started[id] != 1 {
			t.Errorf("job %s started %d times on agents", id, started[id])
		}
		runs := 0
		for _, tr := range j.History {
			if tr.To == broker.StateRunning {
				runs++
			}
			if tr.To == broker.StateLost || tr.Reason == "requeued" {
				t.Errorf("job %s: %s (%s) across the failover", id, tr.To, tr.Reason)
			}
		}
		if runs != 1 {
			t.Errorf("job %s: %d transitions to running", id, runs)
		}
		for i, tr := range before[id] {
			if i >= len(j.History) || !j.History[i].At.Equal(tr.At) || j.History[i].To != tr.To {
				t.Errorf("job %s: history entry %d %+v lost or changed", id, i, tr)
			}
		}
		es := byJob[id]
		slices.SortFunc(es, func(a, b billing.Entry) int { return a.Start.Compare(b.Start) })
		var total int64
		for k, e := range es {
			if k > 0 && !e.Start.Equal(es[k-1].End) {
				t.Errorf("job %s: ledger entry %d starts at %s, the previous ends at %s (gap or overlap)", id, k, e.Start, es[k-1].End)
			}
			total += e.GPUMillis
		}
		if len(es) == 0 || j.EndedAt == nil {
			t.Errorf("job %s: %d ledger entries, ended %v", id, len(es), j.EndedAt)
			continue
		}
		want := j.EndedAt.Sub(j.History[1].At).Milliseconds()
		if diff := total - want; diff < -2000 || diff > 2000 {
			t.Errorf("job %s: ledger %d GPU-ms, allocation %d GPU-ms", id, total, want)
		}
	}
}

// waitEnded waits for a job to end and fails with its history unless it
// succeeded.
func (h *haCluster) waitEnded(id string) {
	h.t.Helper()
	cl := h.client(tokAdmin)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		j, err := cl.Job(context.Background(), id)
		if err == nil && j.State.Terminal() {
			if j.State != broker.StateSucceeded {
				var b strings.Builder
				for _, tr := range j.History {
					fmt.Fprintf(&b, "\n  %s %s → %s (%s) %s", tr.At.Format("15:04:05.000"), tr.From, tr.To, tr.Reason, tr.Detail)
				}
				h.t.Fatalf("job %s ended %s:%s", id, j.State, b.String())
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.t.Fatalf("job %s did not end within 20s", id)
}

// finish releases the jobs, waits for them and for the meter's final
// slices, and stops the brokers cleanly.
func (h *haCluster) finish(ids []string) {
	h.t.Helper()
	os.WriteFile(h.release, nil, 0o600)
	for _, id := range ids {
		h.waitEnded(id)
	}
	h.waitJobsMetered(ids...)
	for _, b := range h.brokers {
		select {
		case <-b.p.done:
			continue
		default:
		}
		if err := b.p.stop(10 * time.Second); err != nil {
			h.t.Error(err)
		}
	}
}

// TestHAFailoverKill9: three brokers on Redis, jobs running on two
// agents; the leader is killed with SIGKILL. A standby leads once the
// lease has expired; the jobs run on undisturbed, new jobs are
// accepted through any broker, and nothing is lost or done twice.
func TestHAFailoverKill9(t *testing.T) {
	h := newHACluster(t)
	h.agent("node-a-"+h.suffix, "sim:4xH100-80GB")
	h.agent("node-b-"+h.suffix, "sim:4xH100-80GB")
	h.waitNodes(2)
	cl := h.client(tokAlice)
	var ids []string
	for i := 0; i < 6; i++ {
		ids = append(ids, h.submit(cl))
	}
	for _, id := range ids {
		h.waitJob(id, 15*time.Second, "running", func(s string) bool { return s == "running" })
	}
	before := h.histories(ids)

	leader := h.waitLeader(h.brokers, 10*time.Second)
	leader.p.kill()
	killed := time.Now()
	var rest []*haBroker
	for _, b := range h.brokers {
		if b != leader {
			rest = append(rest, b)
		}
	}
	// The failover time is a figure (docs/benchmarks.md, "HA failover"),
	// not an assertion: on a loaded machine a standby's renewal step can
	// come late. The deadline only bounds the wait.
	next := h.waitLeader(rest, haTTL+haRenew+30*time.Second)
	t.Logf("%s killed; %s leads after %s (lease %s, renewal %s)", leader.id, next.id, time.Since(killed), haTTL, haRenew)
	h.waitDoor(next)
	// New work through the door: the Go client and the CLI follow the
	// redirect to the new leader.
	ids = append(ids, h.submit(cl))
	out, errOut, code := h.cli(tokAlice, "run", "--gpus", "1", "--time", "10m", "--", "sh", "-c",
		"echo $SPILLWAY_JOB_ID $SPILLWAY_ATTEMPT >> "+h.starts+"; while [ ! -e "+h.release+" ]; do sleep 0.1; done")
	m := regexp.MustCompile(`submitted (\S+)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("CLI run through a standby: exit %d: %q %q", code, out, errOut)
	}
	cliJob := m[1]
	ids = append(ids, cliJob)
	for _, id := range ids[6:] {
		h.waitJob(id, 15*time.Second, "running", func(s string) bool { return s == "running" })
	}
	h.finish(ids)
	h.check(ids, before)
}

// TestHAFencingSIGSTOP: the leader is frozen (SIGSTOP) past its lease, a
// standby takes over, the old leader is thawed (SIGCONT). It must not act
// on what it believed: it stands by, writes nothing (the store would
// refuse its token), sends no orders, and no job starts twice.
func TestHAFencingSIGSTOP(t *testing.T) {
	h := newHACluster(t)
	h.agent("node-a-"+h.suffix, "sim:4xH100-80GB")
	h.agent("node-b-"+h.suffix, "sim:4xH100-80GB")
	h.waitNodes(2)
	cl := h.client(tokAlice)
	var ids []string
	for i := 0; i < 4; i++ {
		ids = append(ids, h.submit(cl))
	}
	for _, id := range ids {
		h.waitJob(id, 15*time.Second, "running", func(s string) bool { return s == "running" })
	}
	before := h.histories(ids)
	ctx := context.Background()
	rs, err := redis.Open(ctx, h.store, redis.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	oldToken, _ := rs.Fence(ctx)

	old := h.waitLeader(h.brokers, time.Second)
	if err := old.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var rest []*haBroker
	for _, b := range h.brokers {
		if b != old {
			rest = append(rest, b)
		}
	}
	next := h.waitLeader(rest, haTTL+haRenew+5*time.Second)
	h.waitDoor(next)
	newToken, _ := rs.Fence(ctx)
	if newToken <= oldToken {
		t.Fatalf("fence %d after the takeover, %d before", newToken, oldToken)
	}
	// Work for the new leader while the old one is frozen. Agents whose
	// long poll was parked on the frozen broker hear nothing until it
	// thaws (or their request times out); then they move to the new one.
	ids = append(ids, h.submit(cl), h.submit(cl))
	for _, id := range ids[4:] {
		h.waitJob(id, 15*time.Second, "placed by the new leader while the old one is frozen", func(s string) bool { return s != "pending" })
	}
	if err := old.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[4:] {
		h.waitJob(id, 15*time.Second, "running", func(s string) bool { return s == "running" })
	}
	// The thawed broker learns it lost and stands by; the new leader
	// keeps its lease and its token.
	deadline := time.Now().Add(30 * time.Second)
	for {
		hz, code := health(old)
		if code == http.StatusOK && !hz.Leader && hz.LeaderURL == next.url {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thawed old leader: health %d %+v", code, hz)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if hz, _ := health(next); hz == nil || !hz.Leader {
		t.Fatal("the new leader lost its lease to the thawed one")
	}
	if cur, _ := rs.Fence(ctx); cur != newToken {
		t.Fatalf("fence moved from %d to %d after the thaw", newToken, cur)
	}
	// The old leader redirects writes and answers agents "not the leader".
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).
		Post(old.url+"/v1/jobs", "application/json", strings.NewReader(`{"resources":{"gpus":1},"command":["true"]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != next.url+"/v1/jobs" {
		t.Fatalf("write to the thawed old leader: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	h.finish(ids)
	h.check(ids, before)
	if out := old.p.output(); !strings.Contains(out, "standing by") {
		t.Errorf("the thawed leader never stood by:\n%s", out)
	}
}

// privateRedis is a redis-server of the test's own (the shared one must
// not go down), persisting every write to an AOF in dir.
type privateRedis struct {
	t    *testing.T
	addr string
	dir  string
	p    *proc
}

func startPrivateRedis(t *testing.T) *privateRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "redis-server is not on PATH (apt-get install -y redis-server)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	r := &privateRedis{t: t, addr: freePort(t), dir: t.TempDir()}
	r.start()
	return r
}

func (r *privateRedis) start() {
	r.t.Helper()
	_, port, _ := strings.Cut(r.addr, ":")
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--dir", r.dir, "--save", "",
		"--appendonly", "yes", "--appendfsync", "always")
	p := &proc{t: r.t, name: "redis", cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p, p
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	r.t.Cleanup(p.kill)
	r.p = p
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", r.addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
	}
	r.t.Fatalf("redis-server on %s did not start:\n%s", r.addr, p.output())
}

// TestHARedisOutage: Redis crashes (SIGKILL) under a leader with running
// jobs, once restarted at once (a blip: the lease may survive it) and once
// after the leader has stepped down, its lease run out (it wins again).
// Meanwhile the broker decides nothing, says so on /healthz (503 with the
// reason) and refuses writes; the agents' jobs keep running and no node is
// lost. When Redis is back (from its AOF) the broker leads again and
// carries on.
func TestHARedisOutage(t *testing.T) {
	r := startPrivateRedis(t)
	h := newHAClusterOn(t, r.addr, 1)
	b := h.brokers[0]
	h.agent("node-a-"+h.suffix, "sim:4xH100-80GB")
	h.waitNodes(1)
	cl := h.client(tokAlice)
	ids := []string{h.submit(cl)}
	h.waitJob(ids[0], 15*time.Second, "running", func(s string) bool { return s == "running" })
	before := h.histories(ids)

	for _, outage := range []string{"a blip", "past the lease"} {
		said := func() (down, lost int) {
			out := b.p.output()
			return strings.Count(out, "store unreachable: no decisions"), strings.Count(out, "lost the leader lease")
		}
		down0, lost0 := said()
		r.p.kill()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var hz struct {
				Status, Error string
			}
			resp, err := http.Get(b.url + "/healthz")
			if err == nil {
				json.NewDecoder(resp.Body).Decode(&hz)
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable && hz.Status == "unhealthy" && strings.Contains(hz.Error, "store unreachable") {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("outage (%s): /healthz never said the store is unreachable (%v)", outage, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/jobs", strings.NewReader(`{"resources":{"gpus":1},"command":["true"]}`))
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("outage (%s): a submit without a store answered %d", outage, resp.StatusCode)
		}
		if outage == "past the lease" {
			// Redis stays down until the broker has said it decides
			// nothing and has given its lease up.
			waitFor(t, haTTL+haRenew+30*time.Second, "the leader to stop deciding and step down while its store is down", func() bool {
				down, lost := said()
				return down > down0 && lost > lost0
			})
		}
		r.start()
		h.waitLeader(h.brokers, haTTL+haRenew+5*time.Second)
		// A new job is accepted and starts once the broker leads again.
		ids = append(ids, h.submit(cl))
		h.waitJob(ids[len(ids)-1], 15*time.Second, "running", func(s string) bool { return s == "running" })
		if j, err := h.client(tokAdmin).Job(context.Background(), ids[0]); err != nil || j.State != broker.StateRunning {
			t.Fatalf("outage (%s): the job running before it is %v (%v)", outage, j, err)
		}
	}
	out := b.p.output()
	for _, want := range []string{"store unreachable: no decisions", "lost the leader lease", "won the leader lease"} {
		if !strings.Contains(out, want) {
			t.Errorf("broker log lacks %q", want)
		}
	}
	h.finish(ids)
	h.check(ids, before)
}
