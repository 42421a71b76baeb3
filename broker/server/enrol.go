package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// Node enrolment (docs/security.md): an operator creates a single-use,
// expiring join token; an agent exchanges it once for its own node
// credential, bound to its name. Only hashes of both are stored.
const (
	// BucketJoinTokens holds "t/<id>" → JoinToken and "h/<sha256>" → id.
	BucketJoinTokens broker.Bucket = "jointokens"
	// BucketNodeCreds holds "c/<id>" → NodeCredential and "h/<sha256>" → id.
	BucketNodeCreds broker.Bucket = "nodecreds"

	joinTokenPrefix = "spjoin."
	nodeCredPrefix  = "spnode."
	// maxJoinTTL bounds how long a join token may live.
	maxJoinTTL = 7 * 24 * time.Hour
)

// NodeCredential is a node's own credential (its secret is not kept).
type NodeCredential struct {
	ID        string     `json:"id"`
	Node      string     `json:"node"`
	MaxGPUs   int        `json:"maxGPUs"`
	IssuedAt  time.Time  `json:"issuedAt"`
	JoinToken string     `json:"joinToken"`
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
	RevokedBy string     `json:"revokedBy,omitempty"`
}

func secretHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func newSecret(prefix, id string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return prefix + id + "." + base64.RawURLEncoding.EncodeToString(b)
}

// createJoinToken serves POST /v1/jointokens (operators).
func (s *Server) createJoinToken(c echo.Context) error {
	var req api.JoinTokenRequest
	if err := decodeBody(c, 4<<10, &req); err != nil {
		return err
	}
	ttl := req.Expires.D()
	if ttl == 0 {
		ttl = time.Hour
	}
	if ttl < time.Minute || ttl > maxJoinTTL {
		return errBadRequest("expires", broker.CodeOutOfRange, "must be between 1m and 168h")
	}
	if req.Node != "" && !nodeNameRe.MatchString(req.Node) {
		return errBadRequest("node", broker.CodeInvalid, "node name must be 1-63 letters, digits, '.', '_' or '-'")
	}
	maxCards := s.cfg().Agents.MaxCardsPerNode
	if req.MaxGPUs == 0 {
		req.MaxGPUs = maxCards
	}
	if req.MaxGPUs < 0 || req.MaxGPUs > maxCards {
		return errBadRequest("maxGPUs", broker.CodeOutOfRange, "must be between 0 and %d (agents.maxCardsPerNode)", maxCards)
	}
	now := s.clock.Now()
	id := s.ids.next(now)
	secret := newSecret(joinTokenPrefix, id)
	jt := api.JoinToken{ID: id, CreatedBy: principal(c).Name, CreatedAt: now, ExpiresAt: now.Add(ttl), Node: req.Node, MaxGPUs: req.MaxGPUs}
	err := s.store.Update(c.Request().Context(), func(tx broker.Tx) error {
		raw, err := json.Marshal(jt)
		if err != nil {
			return err
		}
		if err := tx.Put(BucketJoinTokens, "t/"+id, raw); err != nil {
			return err
		}
		return tx.Put(BucketJoinTokens, "h/"+secretHash(secret), []byte(id))
	})
	if err != nil {
		return fmt.Errorf("store join token: %w", err)
	}
	s.log.Info("join token created", "id", id, "by", jt.CreatedBy, "expires", jt.ExpiresAt, "node", jt.Node)
	return c.JSON(http.StatusCreated, api.JoinTokenAnswer{JoinToken: jt, Token: secret})
}

// listJoinTokens serves GET /v1/jointokens (operators): no secrets.
func (s *Server) listJoinTokens(c echo.Context) error {
	out := []api.JoinToken{}
	err := s.store.View(c.Request().Context(), func(tx broker.Tx) error {
		return tx.Scan(BucketJoinTokens, "t/", broker.PrefixEnd("t/"), func(_ string, v []byte) error {
			var jt api.JoinToken
			if err := json.Unmarshal(v, &jt); err != nil {
				return err
			}
			out = append(out, jt)
			return nil
		})
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"tokens": out})
}

var errBadJoinToken = newError(http.StatusUnauthorized, "unauthorized", "unknown, used or expired join token; ask an operator for a new one (spillway node token create)")

// enrol serves POST /v1/agent/enrol: a join token, once, for a node
// credential bound to the node's name.
func (s *Server) enrol(c echo.Context) error {
	var req agentapi.EnrolRequest
	if err := decodeBody(c, 4<<10, &req); err != nil {
		return err
	}
	if !nodeNameRe.MatchString(req.Node) {
		return errBadRequest("node", broker.CodeInvalid, "node name must be 1-63 letters, digits, '.', '_' or '-'")
	}
	if !strings.HasPrefix(req.JoinToken, joinTokenPrefix) {
		return errBadJoinToken
	}
	now := s.clock.Now()
	credID := s.ids.next(now)
	secret := newSecret(nodeCredPrefix, credID)
	var cred NodeCredential
	bound := ""
	if n, ok := s.nodeRecord(req.Node); ok {
		bound = n.Credential // read before the store's lock: s.mu comes first elsewhere
	}
	err := s.store.Update(c.Request().Context(), func(tx broker.Tx) error {
		id, err := tx.Get(BucketJoinTokens, "h/"+secretHash(req.JoinToken))
		if errors.Is(err, broker.ErrNotFound) {
			return errBadJoinToken
		}
		if err != nil {
			return err
		}
		raw, err := tx.Get(BucketJoinTokens, "t/"+string(id))
		if err != nil {
			return err
		}
		var jt api.JoinToken
		if err := json.Unmarshal(raw, &jt); err != nil {
			return err
		}
		if jt.UsedAt != nil || !now.Before(jt.ExpiresAt) {
			return errBadJoinToken
		}
		if jt.Node != "" && jt.Node != req.Node {
			return errForbidden("this join token enrols node %s, not %s", jt.Node, req.Node)
		}
		// A name already bound to a live credential is not taken over.
		if bound != "" {
			if old, err := getNodeCred(tx, bound); err == nil && old.RevokedAt == nil {
				return newError(http.StatusConflict, "node_enrolled",
					"node %s is enrolled already; revoke it first (spillway node revoke %s)", req.Node, req.Node)
			}
		}
		jt.UsedAt, jt.UsedBy = &now, req.Node
		cred = NodeCredential{ID: credID, Node: req.Node, MaxGPUs: jt.MaxGPUs, IssuedAt: now, JoinToken: jt.ID}
		if raw, err = json.Marshal(jt); err != nil {
			return err
		}
		if err := tx.Put(BucketJoinTokens, "t/"+jt.ID, raw); err != nil {
			return err
		}
		if err := putNodeCred(tx, cred); err != nil {
			return err
		}
		return tx.Put(BucketNodeCreds, "h/"+secretHash(secret), []byte(credID))
	})
	if err != nil {
		return err
	}
	s.log.Info("node enrolled", "node", req.Node, "credential", credID, "join_token", cred.JoinToken, "from", c.RealIP())
	return c.JSON(http.StatusOK, agentapi.EnrolResponse{Node: req.Node, Credential: secret, CA: s.brokerCA(), IssuedAt: now})
}

func (s *Server) nodeRecord(name string) (*broker.Node, bool) {
	s.lock()
	defer s.mu.Unlock()
	n := s.view.Node(name)
	return n, n != nil
}

func getNodeCred(tx broker.Tx, id string) (NodeCredential, error) {
	var nc NodeCredential
	raw, err := tx.Get(BucketNodeCreds, "c/"+id)
	if err != nil {
		return nc, err
	}
	return nc, json.Unmarshal(raw, &nc)
}

func putNodeCred(tx broker.Tx, nc NodeCredential) error {
	raw, err := json.Marshal(nc)
	if err != nil {
		return err
	}
	return tx.Put(BucketNodeCreds, "c/"+nc.ID, raw)
}

// lookupNodeCred resolves a node credential; revoked ones are not found.
func (s *Server) lookupNodeCred(ctx context.Context, secret string) (NodeCredential, bool) {
	var nc NodeCredential
	err := s.store.View(ctx, func(tx broker.Tx) error {
		id, err := tx.Get(BucketNodeCreds, "h/"+secretHash(secret))
		if err != nil {
			return err
		}
		nc, err = getNodeCred(tx, string(id))
		return err
	})
	if err != nil || nc.RevokedAt != nil {
		return NodeCredential{}, false
	}
	return nc, true
}

// revokeNode serves POST /v1/nodes/{name}/revoke (operators): every
// credential of the node stops working at once (401), and the node is
// marked lost so its jobs go back to the queue.
func (s *Server) revokeNode(c echo.Context) error {
	name := c.Param("name")
	now := s.clock.Now()
	by := principal(c).Name
	var revoked []string
	err := s.store.Update(c.Request().Context(), func(tx broker.Tx) error {
		revoked = revoked[:0]
		var creds []NodeCredential
		if err := tx.Scan(BucketNodeCreds, "c/", broker.PrefixEnd("c/"), func(_ string, v []byte) error {
			var nc NodeCredential
			if err := json.Unmarshal(v, &nc); err != nil {
				return err
			}
			if nc.Node == name && nc.RevokedAt == nil {
				creds = append(creds, nc)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, nc := range creds {
			nc.RevokedAt, nc.RevokedBy = &now, by
			if err := putNodeCred(tx, nc); err != nil {
				return err
			}
			revoked = append(revoked, nc.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(revoked) == 0 {
		return newError(http.StatusNotFound, "not_found", "node %s has no live credential", clip(name))
	}
	s.lock()
	if n := s.view.Node(name); n != nil && n.State != broker.NodeLost {
		nn := cloneNode(n)
		nn.State = broker.NodeLost
		var jobs []*broker.Job
		for _, j := range s.view.HoldingOn(name) {
			jj := cloneJob(j)
			s.loseOnLocked(jj, name, now, now, "node_revoked", fmt.Sprintf("node %s's credential was revoked by %s", name, by))
			jobs = append(jobs, jj)
		}
		if err := s.commitLocked(c.Request().Context(), jobs, []*broker.Node{nn}, nil); err != nil {
			s.mu.Unlock()
			return err
		}
		s.kick()
	}
	s.mu.Unlock()
	s.log.Warn("node credential revoked", "node", name, "credentials", revoked, "by", by)
	return c.JSON(http.StatusOK, map[string]any{"node": name, "revoked": revoked})
}

// enrolRoutes registers the enrolment endpoints.
func (s *Server) enrolRoutes(e *echo.Echo, v1 *echo.Group) {
	ops := allow(config.RoleOperator)
	v1.POST("/jointokens", s.createJoinToken, ops)
	v1.GET("/jointokens", s.listJoinTokens, ops)
	v1.POST("/nodes/:name/revoke", s.revokeNode, ops)
	e.POST(agentapi.PathEnrol, s.enrol)
}

// credRevoked reports whether credential id is revoked (or gone).
func (s *Server) credRevoked(ctx context.Context, id string) bool {
	revoked := true
	_ = s.store.View(ctx, func(tx broker.Tx) error {
		nc, err := getNodeCred(tx, id)
		if err == nil {
			revoked = nc.RevokedAt != nil
		}
		return err
	})
	return revoked
}
