package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/labstack/echo/v4"
	"golang.org/x/oauth2"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// People log in with the site's OpenID Connect provider (oidc.*): the CLI
// with the device authorization flow, the dashboard with the code flow.
// Either way the broker verifies the provider's ID token (go-oidc: the
// issuer, the audience, the signature against the provider's JWKS, the
// expiry), maps a claim to a role and team (oidc.rules), and answers with
// a session token of its own ("spsess.…", stored hashed, valid for
// oidc.sessionTTL). Static tokens in auth.tokens stay, for automation.

// BucketSessions holds "s/<id>" → Session and "h/<sha256>" → id.
const BucketSessions broker.Bucket = "sessions"

const sessionPrefix = "spsess."

// Session is a person's login.
type Session struct {
	ID        string        `json:"id"`
	Principal api.Principal `json:"principal"`
	Subject   string        `json:"subject"`
	IssuedAt  time.Time     `json:"issuedAt"`
	ExpiresAt time.Time     `json:"expiresAt"`
}

type oidcState struct {
	mu       sync.Mutex
	provider *oidc.Provider
	device   string
}

var errNoOIDC = newError(http.StatusNotFound, "not_configured", "this broker has no OIDC login (oidc.issuer); use an API token")

// oidcProvider discovers the provider once (lazily: a provider that is
// down does not stop the broker from starting).
func (s *Server) oidcProvider(ctx context.Context) (*oidc.Provider, string, error) {
	if s.cfg().OIDC.Issuer == "" {
		return nil, "", errNoOIDC
	}
	s.oidc.mu.Lock()
	defer s.oidc.mu.Unlock()
	if s.oidc.provider != nil {
		return s.oidc.provider, s.oidc.device, nil
	}
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, s.oidcHTTP()), s.cfg().OIDC.Issuer)
	if err != nil {
		return nil, "", newError(http.StatusBadGateway, "oidc_unavailable", "the OIDC provider %s: %v", s.cfg().OIDC.Issuer, err)
	}
	var extra struct {
		Device string `json:"device_authorization_endpoint"`
	}
	_ = p.Claims(&extra)
	s.oidc.provider, s.oidc.device = p, extra.Device
	return p, extra.Device, nil
}

// oidcHTTP is the client for the provider (tests may point it at theirs).
func (s *Server) oidcHTTP() *http.Client {
	if s.oidcClient != nil {
		return s.oidcClient
	}
	return &http.Client{Timeout: 30 * time.Second}
}

func (s *Server) oauthConfig(p *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{ClientID: s.cfg().OIDC.ClientID, ClientSecret: s.cfg().OIDC.ClientSecret, Endpoint: p.Endpoint(),
		RedirectURL: strings.TrimRight(s.cfg().AdvertiseURL, "/") + "/v1/login/callback",
		Scopes:      []string{oidc.ScopeOpenID, "profile", "email", "groups"}}
}

// loginConfig serves GET /v1/login (no token needed).
func (s *Server) loginConfig(c echo.Context) error {
	p, device, err := s.oidcProvider(c.Request().Context())
	if err != nil {
		return err
	}
	oc := s.oauthConfig(p)
	return c.JSON(http.StatusOK, api.LoginConfig{Issuer: s.cfg().OIDC.Issuer, ClientID: oc.ClientID, DeviceAuthorizationEndpoint: device,
		TokenEndpoint: p.Endpoint().TokenURL, Scopes: oc.Scopes})
}

// login serves POST /v1/login: an ID token for a session.
func (s *Server) login(c echo.Context) error {
	var req api.LoginRequest
	if err := decodeBody(c, 64<<10, &req); err != nil {
		return err
	}
	ans, err := s.sessionFor(c, req.IDToken)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ans)
}

// sessionFor verifies an ID token, maps it and stores a session.
func (s *Server) sessionFor(c echo.Context, rawIDToken string) (*api.LoginAnswer, error) {
	ctx := c.Request().Context()
	p, _, err := s.oidcProvider(ctx)
	if err != nil {
		return nil, err
	}
	now := s.clock.Now()
	v := p.Verifier(&oidc.Config{ClientID: s.cfg().OIDC.ClientID, Now: s.clock.Now})
	tok, err := v.Verify(oidc.ClientContext(ctx, s.oidcHTTP()), rawIDToken)
	if err != nil {
		return nil, newError(http.StatusUnauthorized, "unauthorized", "the ID token does not verify: %v", err)
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return nil, newError(http.StatusUnauthorized, "unauthorized", "the ID token's claims: %v", err)
	}
	pr, ok := mapClaims(s.cfg().OIDC.Rules, claims)
	if !ok {
		return nil, errForbidden("no oidc rule admits %s; ask an operator to add one", tok.Subject)
	}
	pr.Name = personName(claims, tok.Subject)
	id := s.ids.next(now)
	secret := newSecret(sessionPrefix, id)
	sess := Session{ID: id, Principal: pr, Subject: tok.Subject, IssuedAt: now, ExpiresAt: now.Add(s.cfg().OIDC.SessionTTL.D())}
	raw, err := json.Marshal(sess)
	if err != nil {
		return nil, err
	}
	err = s.store.Update(ctx, func(tx broker.Tx) error {
		if err := tx.Put(BucketSessions, "s/"+id, raw); err != nil {
			return err
		}
		return tx.Put(BucketSessions, "h/"+secretHash(secret), []byte(id))
	})
	if err != nil {
		return nil, fmt.Errorf("store session: %w", err)
	}
	c.Set(principalKey, pr) // the audit log names the person
	s.log.Info("login", "name", pr.Name, "role", pr.Role, "team", pr.Team, "subject", tok.Subject, "from", c.RealIP())
	return &api.LoginAnswer{Token: secret, ExpiresAt: sess.ExpiresAt, Principal: pr}, nil
}

// mapClaims applies the first matching rule.
func mapClaims(rules []config.OIDCRule, claims map[string]any) (api.Principal, bool) {
	for _, r := range rules {
		if claimHolds(claims[r.Claim], r.Value) {
			return api.Principal{Role: r.Role, Team: r.Team}, true
		}
	}
	return api.Principal{}, false
}

func claimHolds(v any, want string) bool {
	switch x := v.(type) {
	case string:
		return x == want
	case bool:
		return fmt.Sprint(x) == want
	case []any:
		for _, e := range x {
			if s, ok := e.(string); ok && s == want {
				return true
			}
		}
	}
	return false
}

func personName(claims map[string]any, sub string) string {
	for _, k := range []string{"email", "preferred_username", "name"} {
		if s, ok := claims[k].(string); ok && s != "" {
			return clipName(s)
		}
	}
	return clipName(sub)
}

func clipName(s string) string {
	if len(s) > 128 {
		return s[:128]
	}
	return s
}

// lookupSession resolves a session token; expired ones are not found.
func (s *Server) lookupSession(ctx context.Context, secret string) (api.Principal, bool) {
	var sess Session
	err := s.store.View(ctx, func(tx broker.Tx) error {
		id, err := tx.Get(BucketSessions, "h/"+secretHash(secret))
		if err != nil {
			return err
		}
		raw, err := tx.Get(BucketSessions, "s/"+string(id))
		if err != nil {
			return err
		}
		return json.Unmarshal(raw, &sess)
	})
	if err != nil || !s.clock.Now().Before(sess.ExpiresAt) {
		return api.Principal{}, false
	}
	return sess.Principal, true
}

// loginStart serves GET /v1/login/start: the dashboard's code flow begins
// at the provider; state travels in a short-lived cookie.
func (s *Server) loginStart(c echo.Context) error {
	p, _, err := s.oidcProvider(c.Request().Context())
	if err != nil {
		return err
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	state := base64.RawURLEncoding.EncodeToString(b)
	c.SetCookie(&http.Cookie{Name: "spillway_oidc_state", Value: state, Path: "/v1/login/", MaxAge: 600,
		HttpOnly: true, Secure: strings.HasPrefix(s.cfg().AdvertiseURL, "https://"), SameSite: http.SameSiteLaxMode})
	return c.Redirect(http.StatusFound, s.oauthConfig(p).AuthCodeURL(state))
}

// loginCallback serves GET /v1/login/callback: the provider's code for an
// ID token, a session, and back to the dashboard with the session in the
// URL fragment (never sent to a server; the page moves it to
// sessionStorage and clears it).
func (s *Server) loginCallback(c echo.Context) error {
	ck, err := c.Cookie("spillway_oidc_state")
	if err != nil || ck.Value == "" || ck.Value != c.QueryParam("state") {
		return errBadRequest("state", broker.CodeInvalid, "the login's state does not match; start again from the dashboard")
	}
	if e := c.QueryParam("error"); e != "" {
		return newError(http.StatusUnauthorized, "unauthorized", "the provider refused the login: %s", clip(e))
	}
	ctx := c.Request().Context()
	p, _, err := s.oidcProvider(ctx)
	if err != nil {
		return err
	}
	tok, err := s.oauthConfig(p).Exchange(oidc.ClientContext(ctx, s.oidcHTTP()), c.QueryParam("code"))
	if err != nil {
		return newError(http.StatusUnauthorized, "unauthorized", "exchange the code: %v", err)
	}
	raw, ok := tok.Extra("id_token").(string)
	if !ok {
		return newError(http.StatusUnauthorized, "unauthorized", "the provider sent no ID token")
	}
	ans, err := s.sessionFor(c, raw)
	if err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{Name: "spillway_oidc_state", Path: "/v1/login/", MaxAge: -1})
	return c.Redirect(http.StatusFound, "/ui/#session="+url.QueryEscape(ans.Token))
}

func (s *Server) oidcRoutes(e *echo.Echo) {
	e.GET("/v1/login", s.loginConfig)
	e.POST("/v1/login", s.login)
	e.GET("/v1/login/start", s.loginStart)
	e.GET("/v1/login/callback", s.loginCallback)
}
