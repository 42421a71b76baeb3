package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// tokenState is the auth tokens in force: the config's (replaced by
// reloadTokens on SIGHUP) less those revoked through the API, which are
// kept in the store by hash so a revocation outlives restarts and reloads.
type tokenState struct {
	mu      sync.RWMutex
	tokens  []config.Token // nil: s.cfg().Auth.Tokens
	revoked map[string]bool
	loaded  bool
}

// revokedKey prefixes the meta keys of revoked token hashes.
const revokedKey = "token-revoked/"

// tokenHash is the hex SHA-256 a config entry matches.
func tokenHash(t config.Token) string {
	if t.TokenSHA256 != "" {
		return strings.ToLower(t.TokenSHA256)
	}
	sum := sha256.Sum256([]byte(t.Token))
	return hex.EncodeToString(sum[:])
}

// activeTokens returns the tokens in force and the revoked hashes.
func (s *Server) activeTokens() ([]config.Token, map[string]bool) {
	ts := &s.tokenSt
	ts.mu.RLock()
	if ts.loaded {
		defer ts.mu.RUnlock()
		return cmpOr(ts.tokens, s.staticTokens), ts.revoked
	}
	ts.mu.RUnlock()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if !ts.loaded {
		ts.revoked = map[string]bool{}
		_ = s.store.View(context.Background(), func(tx broker.Tx) error {
			return tx.Scan(broker.BucketMeta, revokedKey, broker.PrefixEnd(revokedKey), func(k string, _ []byte) error {
				ts.revoked[strings.TrimPrefix(k, revokedKey)] = true
				return nil
			})
		})
		ts.loaded = true
	}
	return cmpOr(ts.tokens, s.staticTokens), ts.revoked
}

func cmpOr(a, b []config.Token) []config.Token {
	if a != nil {
		return a
	}
	return b
}

// reloadTokens replaces the config's auth tokens (a config reload,
// after the new file passed validation). Revocations stay.
func (s *Server) reloadTokens(tokens []config.Token) {
	ts := &s.tokenSt
	ts.mu.Lock()
	ts.tokens = hashStaticTokens(tokens) // kept hashed only, as at start
	ts.mu.Unlock()
	s.log.Info("auth tokens reloaded", "tokens", len(tokens))
}

func (s *Server) listTokens(c echo.Context) error {
	tokens, revoked := s.activeTokens()
	out := make([]api.TokenView, 0, len(tokens))
	for _, t := range tokens {
		out = append(out, api.TokenView{Name: t.Name, Role: t.Role, Team: t.Team, Revoked: revoked[tokenHash(t)]})
	}
	return c.JSON(http.StatusOK, map[string]any{"tokens": out})
}

// revokeToken refuses the named config token from now on, across
// restarts and reloads; audited. Replace it with a new entry (spillway
// token create) under another name or secret.
func (s *Server) revokeToken(c echo.Context) error {
	p := principal(c)
	tokens, _ := s.activeTokens()
	name := c.Param("name")
	var hash string
	for _, t := range tokens {
		if t.Name == name {
			hash = tokenHash(t)
		}
	}
	if hash == "" {
		return newError(http.StatusNotFound, "not_found", "token %s not found", clip(name))
	}
	now := s.clock.Now()
	rec := broker.AuditRecord{At: now, By: p.Name, Action: "token.revoke", Target: name, Old: "active", New: "revoked"}
	if err := s.store.Batch(c.Request().Context(), func(tx broker.Tx) error {
		if err := tx.Put(broker.BucketMeta, revokedKey+hash, []byte(now.UTC().Format(time.RFC3339))); err != nil {
			return err
		}
		return broker.Audit(tx, rec)
	}); err != nil {
		return err
	}
	ts := &s.tokenSt
	ts.mu.Lock()
	ts.revoked[hash] = true
	ts.mu.Unlock()
	s.log.Info("token revoked", "token", name, "by", p.Name)
	return c.JSON(http.StatusOK, api.TokenView{Name: name, Revoked: true})
}
