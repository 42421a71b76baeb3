package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/onprem/wire"
)

// pinnedCAFile is the broker's CA as the agent pinned it at enrolment.
const pinnedCAFile = "broker-ca.pem"

// credentialFile holds the node credential the agent got at enrolment.
const credentialFile = "node-credential.json"

// brokerCA is the CA bundle the agent trusts the broker by: the
// configured one (caFile or ca), else the CA pinned at enrolment; nil for
// the system roots.
func brokerCA(cfg Config) ([]byte, error) {
	switch {
	case cfg.CA != "":
		return []byte(cfg.CA), nil
	case cfg.CAFile != "":
		return wire.ReadCA(cfg.CAFile)
	default:
		b, err := os.ReadFile(filepath.Join(cfg.DataDir, pinnedCAFile))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read pinned broker CA: %w", err)
		}
		return b, nil
	}
}

// jobCAFile is where, in an attempt's directory, the job finds the
// broker's CA (SPILLWAY_CA), so its own spillway calls (checkpoint,
// units) trust the broker as the agent does.
const jobCAFile = ".spillway/broker-ca.pem"

// handCAToJob makes the attempt's Prepare step also write the broker's CA
// into the attempt's directory, which then goes to the job's uid, and set
// SPILLWAY_CA to it. Nothing is written for a plain-HTTP broker or one
// trusted through the system roots.
func (ag *Agent) handCAToJob(j *jobrt.Job) {
	if !strings.HasPrefix(ag.cfg.Broker, "https://") {
		return
	}
	ca, err := brokerCA(ag.cfg)
	if err != nil || len(ca) == 0 {
		return
	}
	prev := j.Prepare
	j.Prepare = func(dir string) error {
		if prev != nil {
			if err := prev(dir); err != nil {
				return err
			}
		}
		p := filepath.Join(dir, jobCAFile)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("hand the broker CA to the job: %w", err)
		}
		if err := os.WriteFile(p, ca, 0o644); err != nil {
			return fmt.Errorf("hand the broker CA to the job: %w", err)
		}
		j.Env = append(j.Env, ag.jobPaths(dir, []string{"SPILLWAY_CA=" + p})...)
		return nil
	}
}

// agentTLS is the agent's trust in the broker (brokerCA).
func agentTLS(cfg Config) (*tls.Config, error) {
	ca, err := brokerCA(cfg)
	if err != nil {
		return nil, err
	}
	tc, err := wire.ClientTLS(ca)
	if err != nil {
		return nil, fmt.Errorf("broker CA: %w", err)
	}
	return tc, nil
}

// savedCredential is the node credential the broker issued at enrolment,
// bound to the node's name.
type savedCredential struct {
	Broker string `json:"broker"`
	Node   string `json:"node"`
	Token  string `json:"token"`
}

// loadCredential uses the credential of an earlier enrolment when the
// config names no token of its own.
func loadCredential(cfg *Config) error {
	raw, err := os.ReadFile(filepath.Join(cfg.DataDir, credentialFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read node credential: %w", err)
	}
	var c savedCredential
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("node credential %s: %w", filepath.Join(cfg.DataDir, credentialFile), err)
	}
	if c.Node != cfg.Name {
		return fmt.Errorf("the node credential in %s belongs to node %s, not %s; remove it and enrol again with a join token", cfg.DataDir, c.Node, cfg.Name)
	}
	if cfg.Token == "" || cfg.JoinToken != "" {
		cfg.Token, cfg.JoinToken = c.Token, ""
	}
	return nil
}

func saveCredential(dir string, c savedCredential) error {
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, credentialFile+".tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, credentialFile))
}

// enrol exchanges the join token for the node's own credential, saves it
// (DataDir/node-credential.json) and pins the broker's CA it names
// (DataDir/broker-ca.pem): later starts need neither the join token nor
// the system's roots. The join token is single-use: a second try fails.
func (ag *Agent) enrol(ctx context.Context) error {
	body, err := json.Marshal(agentapi.EnrolRequest{JoinToken: ag.cfg.JoinToken, Node: ag.cfg.Name})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(ag.cfg.Broker, "/")+agentapi.PathEnrol, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ag.http.Do(req)
	if err != nil {
		return fmt.Errorf("enrol: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var eb agentapi.ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error.Message != "" {
			return fmt.Errorf("enrol: broker answered %d: %s", resp.StatusCode, eb.Error.Message)
		}
		return fmt.Errorf("enrol: broker answered %d", resp.StatusCode)
	}
	var er agentapi.EnrolResponse
	if err := json.Unmarshal(raw, &er); err != nil {
		return fmt.Errorf("enrol: %w", err)
	}
	if er.Node != ag.cfg.Name || !strings.HasPrefix(er.Credential, "spnode.") {
		return fmt.Errorf("enrol: the broker answered for node %q", er.Node)
	}
	if err := saveCredential(ag.cfg.DataDir, savedCredential{Broker: ag.cfg.Broker, Node: er.Node, Token: er.Credential}); err != nil {
		return fmt.Errorf("save node credential: %w", err)
	}
	if er.CA != "" {
		tc, err := wire.ClientTLS([]byte(er.CA))
		if err != nil {
			return fmt.Errorf("enrol: the broker's CA: %w", err)
		}
		if err := os.WriteFile(filepath.Join(ag.cfg.DataDir, pinnedCAFile), []byte(er.CA), 0o644); err != nil {
			return fmt.Errorf("pin broker CA: %w", err)
		}
		if ag.cfg.CA == "" && ag.cfg.CAFile == "" {
			ag.http = brokerHTTP(ag.cfg.Peers, tc)
		}
	}
	ag.cfg.Token, ag.cfg.JoinToken = er.Credential, ""
	ag.log.Info("enrolled with the broker: this node has its own credential now", "node", er.Node)
	return nil
}
