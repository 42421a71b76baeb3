package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/client"
)

// bin is the spillway binary built once for all tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "spillway-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Jobs run as unprivileged uids (the agent's runtime); some call the
	// binary themselves (spillway checkpoint).
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "spillway")
	build := exec.Command("go", "build", "-o", bin, "../cmd/spillway")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build spillway:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Tokens of the test cluster.
const (
	tokAlice = "alice-token-0123456789abcdef"
	tokBob   = "bob-token-0123456789abcdef00"
	tokAdmin = "admin-token-0123456789abcdef"
	tokAgent = "agent-token-0123456789abcdef"
)

// freePort returns a loopback address nobody listens on.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is a child process whose output is kept for the test log.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		// A clean stop first: an agent stops its jobs on the way out, so
		// no test leaves processes holding simulated cards for the next.
		if p.stop(10*time.Second) != nil {
			p.kill()
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.output())
		}
	})
	return p
}

// kill sends SIGKILL to the process (not its group: a broker's jobs belong
// to agents, an agent's jobs must survive it like on a real crash).
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop sends SIGINT and waits for a clean exit.
func (p *proc) stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
		if p.cmd.ProcessState.ExitCode() != 0 {
			return fmt.Errorf("%s exited with %d", p.name, p.cmd.ProcessState.ExitCode())
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s did not stop within %s", p.name, timeout)
	}
}

// cluster is a broker process and its config on a temp dir.
type cluster struct {
	t      *testing.T
	dir    string
	addr   string
	url    string
	config string
	broker *proc
	// viewer is the token used to poll nodes and jobs (an operator's).
	viewer string
	// ca is the CA file of a broker serving HTTPS ("" for plain HTTP).
	ca string
}

// httpClient is a plain HTTP client that trusts the cluster's CA.
func (c *cluster) httpClient() *http.Client {
	if c.ca == "" {
		return http.DefaultClient
	}
	raw, err := os.ReadFile(c.ca)
	if err != nil {
		return http.DefaultClient // not written yet: the caller retries
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(raw)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func newCluster(t *testing.T, extraConfig string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), addr: freePort(t), viewer: tokAdmin}
	// Jobs run as unprivileged uids when the tests run as root; the files
	// tests share with their jobs live in this directory.
	os.Chmod(filepath.Dir(c.dir), 0o755)
	os.Chmod(c.dir, 0o777)
	c.url = "http://" + c.addr
	c.config = filepath.Join(c.dir, "broker.yaml")
	cfg := fmt.Sprintf(`listen: %s
dataDir: data
tls: {insecure: true}
scheduler: {interval: 200ms}
agents: {heartbeatInterval: 500ms, lostAfter: 4}
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: bob, role: user, team: vision, token: %s}
    - {name: admin, role: operator, token: %s}
    - {name: agents, role: agent, token: %s}
%s`, c.addr, tokAlice, tokBob, tokAdmin, tokAgent, extraConfig)
	if err := os.WriteFile(c.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startBroker()
	return c
}

func (c *cluster) startBroker() {
	c.t.Helper()
	c.broker = start(c.t, "broker", "server", "--config", c.config)
	c.waitHealthy(30 * time.Second)
}

func (c *cluster) waitHealthy(within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := c.httpClient().Get(c.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("broker not healthy within %s", within)
}

func (c *cluster) agent(name, gpus string) *proc {
	c.t.Helper()
	if strings.HasPrefix(gpus, "sim:") {
		// Cards of their own: a stray process of another test never
		// holds this cluster's simulated cards.
		gpus += ",seed=" + filepath.Base(c.dir)
	}
	return start(c.t, "agent "+name, "agent", "--broker", c.url, "--token", tokAgent, "--name", name,
		"--gpus", gpus, "--data-dir", filepath.Join(c.dir, "agent-"+name))
}

func (c *cluster) client(token string) *client.Client {
	cl := client.New(c.url, token)
	if c.ca != "" {
		if err := cl.TrustCAFile(c.ca); err != nil {
			c.t.Fatal(err)
		}
	}
	return cl
}

// cli runs the spillway CLI against the cluster.
func (c *cluster) cli(token string, args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "SPILLWAY_SERVER="+c.url, "SPILLWAY_TOKEN="+token, "SPILLWAY_CONFIG=/nonexistent", "SPILLWAY_CA="+c.ca)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			c.t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// waitNodes waits until n nodes are ready.
func (c *cluster) waitNodes(n int) {
	c.t.Helper()
	cl := c.client(c.viewer)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		nodes, err := cl.Nodes(context.Background())
		ready := 0
		for _, nd := range nodes {
			if nd.State == "ready" {
				ready++
			}
		}
		if err == nil && ready >= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("%d nodes not ready in time", n)
}

// waitState polls a job until cond holds.
func (c *cluster) waitJob(id string, within time.Duration, what string, cond func(state string) bool) string {
	c.t.Helper()
	cl := c.client(c.viewer)
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		j, err := cl.Job(context.Background(), id)
		if err == nil {
			last = string(j.State)
			if cond(last) {
				return last
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	explain, _, _ := c.cli(c.viewer, "explain", id)
	c.t.Fatalf("job %s: %s not reached within %s (last state %q); spillway explain says:\n%s", id, what, within, last, explain)
	return ""
}

func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

var _ = io.Discard

// ledgerRow is one ledger entry of the JSON export (the columns we read).
type ledgerRow struct {
	Job      *string `json:"x_Job"`
	Node     *string `json:"x_Node"`
	Instance *string `json:"x_InstanceId"`
	Kind     string  `json:"x_Kind"`
	Start    string  `json:"ChargePeriodStart"`
	End      string  `json:"ChargePeriodEnd"`
}

// ledger reads every ledger entry through the export API.
func (c *cluster) ledger() []ledgerRow {
	c.t.Helper()
	var buf bytes.Buffer
	if err := c.client(tokAdmin).Export(context.Background(), client.BillingQuery{Format: "json", Granularity: "entry"}, &buf); err != nil {
		c.t.Fatal(err)
	}
	var rows []ledgerRow
	if err := json.Unmarshal(buf.Bytes(), &rows); err != nil {
		c.t.Fatalf("export: %v\n%s", err, buf.String())
	}
	return rows
}

// waitLedgerThrough waits until the ledger holds an entry that match
// accepts ending at or after end. The meter writes the last, partial slice
// of an allocation or a machine at its first cycle after it ended.
func (c *cluster) waitLedgerThrough(what string, end time.Time, match func(ledgerRow) bool) {
	c.t.Helper()
	end = end.UTC().Truncate(time.Millisecond)
	waitFor(c.t, time.Minute, "the ledger to hold "+what+" through "+end.Format(time.RFC3339Nano), func() bool {
		for _, r := range c.ledger() {
			if e, err := time.Parse(time.RFC3339Nano, r.End); err == nil && match(r) && !e.Before(end) {
				return true
			}
		}
		return false
	})
}

// waitMachineMetered waits until the ledger holds burst machine id, which
// has ended, through its end.
func (c *cluster) waitMachineMetered(id string) {
	c.t.Helper()
	m, err := c.client(tokAdmin).Instance(context.Background(), id)
	if err != nil || m.TerminatedAt == nil {
		c.t.Fatalf("machine %s has not ended: %+v %v", id, m, err)
	}
	c.waitLedgerThrough("machine "+id, *m.TerminatedAt, func(r ledgerRow) bool { return r.Instance != nil && *r.Instance == id })
}

// waitJobsMetered waits until the ledger holds each job, which has given
// its GPUs back, through the moment it did.
func (c *cluster) waitJobsMetered(ids ...string) {
	c.t.Helper()
	for _, id := range ids {
		j, err := c.client(tokAdmin).Job(context.Background(), id)
		if err != nil {
			c.t.Fatal(err)
		}
		var gave time.Time
		for _, tr := range j.History {
			if tr.From.Holding() && !tr.To.Holding() {
				gave = tr.At
			}
		}
		if gave.IsZero() || j.State.Holding() {
			c.t.Fatalf("job %s (%s) has not given its GPUs back", id, j.State)
		}
		c.waitLedgerThrough("job "+id, gave, func(r ledgerRow) bool { return r.Job != nil && *r.Job == id })
	}
}
