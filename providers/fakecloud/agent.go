package fakecloud

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// Paths of the stand-in broker's registration API.
const (
	registerPath  = "/fakecloud/agents/register"
	heartbeatPath = "/fakecloud/agents/heartbeat"
)

// RunAgentIfAsked turns a test binary into a stand-in agent: call it first
// in TestMain. When the binary was started as `<bin> agent --config <path>`
// (which is how the bootstrap starts the binary it uploaded, here the test
// binary itself), it reads the agent config, registers with the broker URL
// in it using the per-machine token, heartbeats until the broker goes away,
// and exits. Otherwise it returns at once.
func RunAgentIfAsked() {
	if len(os.Args) < 2 || os.Args[1] != "agent" {
		return
	}
	os.Exit(agentMain(os.Args[2:]))
}

func agentMain(args []string) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	path := fs.String("config", "", "agent config file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	raw, err := os.ReadFile(*path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake agent:", err)
		return 1
	}
	cfg, err := bootstrap.ParseAgentConfig(raw)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake agent:", err)
		return 1
	}
	body, _ := json.Marshal(Registration{Name: cfg.Name, Labels: cfg.Labels, GPUs: cfg.GPUs, PID: os.Getpid()})
	req, _ := http.NewRequest(http.MethodPost, strings.TrimRight(cfg.Broker, "/")+registerPath, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake agent: register:", err)
		return 1
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(os.Stderr, "fake agent: register: %s: %s\n", resp.Status, strings.TrimSpace(string(msg)))
		return 1
	}
	fmt.Fprintln(os.Stderr, "fake agent: registered as", cfg.Name)
	// Heartbeat until the broker is gone or says stop.
	for {
		time.Sleep(250 * time.Millisecond)
		hb, _ := http.NewRequest(http.MethodPost, strings.TrimRight(cfg.Broker, "/")+heartbeatPath, nil)
		hb.Header.Set("Authorization", "Bearer "+cfg.Token)
		resp, err := http.DefaultClient.Do(hb)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0
		}
	}
}

// Registration is what a stand-in agent reported.
type Registration struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	GPUs   string            `json:"gpus"`
	PID    int               `json:"pid"`
	At     time.Time         `json:"at"`
}

// Registrar stands in for the broker's agent registration: it accepts an
// agent only with the token expected for its name, as the broker's
// per-machine tokens work.
type Registrar struct {
	// URL is the broker URL to put in the agent config.
	URL string
	srv *httptest.Server

	mu     sync.Mutex
	tokens map[string]string // name → token
	regs   map[string]Registration
	wake   chan struct{} // closed and replaced on every registration
}

// StartRegistrar starts a registrar on 127.0.0.1; Close ends it.
func StartRegistrar() *Registrar {
	r := &Registrar{tokens: map[string]string{}, regs: map[string]Registration{}, wake: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	return r
}

// Close ends the registrar.
func (r *Registrar) Close() { r.srv.Close() }

// Expect lets the agent called name register with token.
func (r *Registrar) Expect(name, token string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tokens[name] = token
}

// Revoke makes the token of name invalid: registrations and heartbeats
// with it are refused from now on.
func (r *Registrar) Revoke(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tokens, name)
}

// Registration returns what the agent called name reported, if it did.
func (r *Registrar) Registration(name string) (Registration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg, ok := r.regs[name]
	return reg, ok
}

// Wait blocks until the agent called name has registered.
func (r *Registrar) Wait(ctx context.Context, name string) error {
	for {
		r.mu.Lock()
		_, ok := r.regs[name]
		wake := r.wake
		r.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for agent %s: %w", name, ctx.Err())
		case <-wake:
		}
	}
}

func (r *Registrar) serve(w http.ResponseWriter, req *http.Request) {
	token := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
	switch req.URL.Path {
	case registerPath:
		var reg Registration
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&reg); err != nil {
			http.Error(w, "bad registration: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if want, ok := r.tokens[reg.Name]; !ok || want != token {
			http.Error(w, "token not valid for "+reg.Name, http.StatusUnauthorized)
			return
		}
		reg.At = time.Now()
		r.regs[reg.Name] = reg
		close(r.wake)
		r.wake = make(chan struct{})
	case heartbeatPath:
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, tok := range r.tokens {
			if tok == token {
				return
			}
		}
		http.Error(w, "token revoked", http.StatusGone)
	default:
		http.NotFound(w, req)
	}
}
