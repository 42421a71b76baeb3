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
	"github.com/spillway-dev/spillway/onprem/wire"
)

// pinnedCAFile is the broker's CA as the agent pinned it at enrolment.
const pinnedCAFile = "broker-ca.pem"

// credentialFile holds the node credential the agent got at enrolment.
const credentialFile = "node-credential.json"

// agentTLS is the agent's trust in the broker: the configured bundle
// (caFile or ca), else the CA pinned at enrolment, else the system roots.
func agentTLS(cfg Config) (*tls.Config, error) {
	var ca []byte
	switch {
	case cfg.CA != "":
		ca = []byte(cfg.CA)
	case cfg.CAFile != "":
		b, err := wire.ReadCA(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		ca = b
	default:
		b, err := os.ReadFile(filepath.Join(cfg.DataDir, pinnedCAFile))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read pinned broker CA: %w", err)
		}
		ca = b
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
