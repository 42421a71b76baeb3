package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

const principalKey = "spillway.principal"

func principal(c echo.Context) api.Principal {
	p, _ := c.Get(principalKey).(api.Principal)
	return p
}

// authenticate resolves the bearer token to a Principal, or answers 401.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header.Get("Authorization")
		secret, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || secret == "" {
			return errUnauthorized
		}
		p, ok := s.lookupToken(c.Request().Context(), secret)
		if !ok {
			return errUnauthorized
		}
		c.Set(principalKey, p)
		return next(c)
	}
}

func (s *Server) lookupToken(ctx context.Context, secret string) (api.Principal, bool) {
	tokens, revoked := s.activeTokens()
	for _, t := range tokens {
		if t.Matches(secret) {
			if revoked[tokenHash(t)] {
				return api.Principal{}, false
			}
			return api.Principal{Name: t.Name, Role: t.Role, Team: t.Team}, true
		}
	}
	// A person's login session: valid until it expires.
	if strings.HasPrefix(secret, sessionPrefix) {
		return s.lookupSession(ctx, secret)
	}
	// An enrolled node's credential: valid until revoked.
	if strings.HasPrefix(secret, nodeCredPrefix) {
		nc, ok := s.lookupNodeCred(ctx, secret)
		if !ok {
			return api.Principal{}, false
		}
		return api.Principal{Name: "node " + nc.Node, Role: config.RoleAgent, Node: nc.Node, Credential: nc.ID, MaxGPUs: nc.MaxGPUs}, true
	}
	// A burst machine's own token: valid while its record is live.
	sum := sha256.Sum256([]byte(secret))
	var rec *broker.InstanceRecord
	err := s.store.View(ctx, func(tx broker.Tx) error {
		var err error
		rec, err = broker.InstanceByToken(tx, hex.EncodeToString(sum[:]))
		return err
	})
	if err != nil || rec == nil || rec.State.Ended() || rec.State == broker.MachineTerminating {
		return api.Principal{}, false
	}
	return api.Principal{Name: "machine " + rec.ID, Role: config.RoleAgent, Node: rec.ID}, true
}

// allow answers 403 unless the caller has one of roles.
func allow(roles ...string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p := principal(c)
			for _, r := range roles {
				if p.Role == r {
					return next(c)
				}
			}
			return errForbidden("role %s may not %s %s", p.Role, c.Request().Method, c.Path())
		}
	}
}

// canSeeTeam reports whether the caller may see a team's jobs: operators
// see all, users their own team.
func canSeeTeam(p api.Principal, team string) bool {
	return p.Role == config.RoleOperator || (p.Role == config.RoleUser && p.Team == team)
}

// hashStaticTokens copies the config's tokens with their secrets replaced
// by SHA-256 hashes: the running broker keeps no static token in clear
// (Token.Matches compares hashes in constant time).
func hashStaticTokens(in []config.Token) []config.Token {
	out := make([]config.Token, len(in))
	for i, t := range in {
		if t.Token != "" {
			sum := sha256.Sum256([]byte(t.Token))
			t.TokenSHA256, t.Token = hex.EncodeToString(sum[:]), ""
		}
		out[i] = t
	}
	return out
}
