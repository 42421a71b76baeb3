package server

import (
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/oidctest"
)

func oidcHarness(t *testing.T) (*harness, *oidctest.Provider) {
	t.Helper()
	p := oidctest.New("spillway", "client-secret-0123")
	t.Cleanup(p.Close)
	h := newHarness(t)
	p.Now = h.clock.Now
	h.srv.cfg().OIDC = config.OIDC{Issuer: p.URL, ClientID: "spillway", ClientSecret: "client-secret-0123",
		SessionTTL: broker.Duration(time.Hour), Rules: []config.OIDCRule{
			{Claim: "groups", Value: "ml-ops", Role: config.RoleOperator},
			{Claim: "groups", Value: "ml-nlp", Role: config.RoleUser, Team: "nlp"},
		}}
	h.srv.cfg().AdvertiseURL = h.http.URL
	return h, p
}

// TestOIDCLogin: an ID token from the provider becomes a session whose
// role and team come from the rules; the session works as a bearer token
// until it expires; a token the provider did not sign, one for another
// audience and a person no rule admits are refused.
func TestOIDCLogin(t *testing.T) {
	h, p := oidcHarness(t)
	var cfg api.LoginConfig
	if code := h.do("GET", "/v1/login", "", nil, &cfg); code != http.StatusOK || cfg.DeviceAuthorizationEndpoint != p.URL+"/device" {
		t.Fatalf("login config: %d %+v", code, cfg)
	}
	idt := p.IDToken(map[string]any{"sub": "u-1", "email": "carol@example.com", "groups": []string{"staff", "ml-nlp"}})
	var ans api.LoginAnswer
	if code := h.do("POST", "/v1/login", "", api.LoginRequest{IDToken: idt}, &ans); code != http.StatusOK || !strings.HasPrefix(ans.Token, "spsess.") {
		t.Fatalf("login: %d %+v", code, ans)
	}
	if ans.Principal.Role != config.RoleUser || ans.Principal.Team != "nlp" || ans.Principal.Name != "carol@example.com" {
		t.Fatalf("principal %+v", ans.Principal)
	}
	var who api.Principal
	if code := h.do("GET", "/v1/whoami", ans.Token, nil, &who); code != http.StatusOK || who.Team != "nlp" {
		t.Fatalf("whoami with the session: %d %+v", code, who)
	}
	j := h.submit(ans.Token, oneGPU)
	if j.Spec.Team != "nlp" || j.User != "carol@example.com" {
		t.Fatalf("job of the session: team %s user %s", j.Spec.Team, j.User)
	}
	if code := h.do("PUT", "/v1/budgets/global", ans.Token, `{"limit": "1"}`, nil); code != http.StatusForbidden {
		t.Fatalf("a user session set a budget: %d", code)
	}
	// Refused logins.
	forged := oidctest.New("spillway", "x") // another key, same audience
	defer forged.Close()
	bad := strings.Replace(forged.IDToken(map[string]any{"sub": "u-1", "groups": []string{"ml-ops"}}), forged.URL, p.URL, 1)
	for name, tok := range map[string]string{
		"another key":      bad,
		"another audience": p.Sign(map[string]any{"iss": p.URL, "aud": "other", "sub": "u", "exp": h.clock.Now().Add(time.Hour).Unix(), "iat": h.clock.Now().Unix(), "groups": []string{"ml-ops"}}),
		"expired":          p.Sign(map[string]any{"iss": p.URL, "aud": "spillway", "sub": "u", "exp": h.clock.Now().Add(-time.Minute).Unix(), "iat": h.clock.Now().Add(-time.Hour).Unix(), "groups": []string{"ml-ops"}}),
	} {
		if code := h.do("POST", "/v1/login", "", api.LoginRequest{IDToken: tok}, nil); code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, code)
		}
	}
	if code := h.do("POST", "/v1/login", "", api.LoginRequest{IDToken: p.IDToken(map[string]any{"sub": "u-2", "groups": []string{"staff"}})}, nil); code != http.StatusForbidden {
		t.Errorf("no rule admits: %d, want 403", code)
	}
	// Sessions end.
	h.clock.Step(time.Hour + time.Second)
	if code := h.do("GET", "/v1/whoami", ans.Token, nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("an expired session: %d", code)
	}
	// Static tokens stay for automation.
	if code := h.do("GET", "/v1/whoami", tokAlice, nil, nil); code != http.StatusOK {
		t.Fatalf("static token: %d", code)
	}
}

// TestOIDCDashboardCodeFlow: the dashboard's login goes to the provider
// and back with a session for the dashboard.
func TestOIDCDashboardCodeFlow(t *testing.T) {
	h, p := oidcHarness(t)
	p.Claims = map[string]any{"sub": "u-9", "email": "ops@example.com", "groups": []string{"ml-ops"}}
	jar, _ := cookiejar.New(nil)
	var final *url.URL
	cl := &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if strings.HasPrefix(req.URL.Path, "/ui/") {
			final = req.URL
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := cl.Get(h.http.URL + "/v1/login/start")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if final == nil || !strings.HasPrefix(final.Fragment, "session=spsess.") {
		t.Fatalf("the code flow ended at %v (%d)", final, resp.StatusCode)
	}
	tok := strings.TrimPrefix(final.Fragment, "session=")
	var who api.Principal
	if code := h.do("GET", "/v1/whoami", tok, nil, &who); code != http.StatusOK || who.Role != config.RoleOperator || who.Name != "ops@example.com" {
		t.Fatalf("whoami: %d %+v", code, who)
	}
	// A callback with a state the browser did not start is refused.
	resp, err = http.Get(h.http.URL + "/v1/login/callback?code=x&state=forged")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("forged state: %d", resp.StatusCode)
	}
}
