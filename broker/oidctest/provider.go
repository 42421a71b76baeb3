// Package oidctest is a small OpenID Connect provider for tests: discovery,
// JWKS, the authorization code flow and the device authorization flow,
// with RS256-signed ID tokens. It approves every login at once as the
// person whose claims the test sets.
package oidctest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"time"
)

// Provider is a running test provider.
type Provider struct {
	*httptest.Server
	ClientID     string
	ClientSecret string
	key          *rsa.PrivateKey

	mu sync.Mutex
	// Claims are the claims of the person who logs in next (sub, email,
	// groups, …); iss, aud, iat and exp are added.
	Claims map[string]any
	// Now is the provider's clock (time.Now when nil).
	Now   func() time.Time
	codes map[string]map[string]any
	// Polls counts device token requests.
	Polls int
}

// New starts a provider on 127.0.0.1.
func New(clientID, clientSecret string) *Provider {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	p := &Provider{ClientID: clientID, ClientSecret: clientSecret, key: key, codes: map[string]map[string]any{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", p.discovery)
	mux.HandleFunc("/jwks", p.jwks)
	mux.HandleFunc("/authorize", p.authorize)
	mux.HandleFunc("/device", p.device)
	mux.HandleFunc("/token", p.token)
	p.Server = httptest.NewServer(mux)
	return p
}

func (p *Provider) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *Provider) discovery(w http.ResponseWriter, r *http.Request) {
	u := p.URL
	writeJSON(w, map[string]any{
		"issuer": u, "authorization_endpoint": u + "/authorize", "token_endpoint": u + "/token",
		"jwks_uri": u + "/jwks", "device_authorization_endpoint": u + "/device",
		"response_types_supported": []string{"code"}, "subject_types_supported": []string{"public"},
		"id_token_signing_alg_values_supported": []string{"RS256"},
	})
}

func (p *Provider) jwks(w http.ResponseWriter, r *http.Request) {
	pub := p.key.PublicKey
	writeJSON(w, map[string]any{"keys": []map[string]any{{
		"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256",
		"n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes()),
	}}})
}

// authorize approves at once and sends the browser back with a code.
func (p *Provider) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("client_id") != p.ClientID || q.Get("response_type") != "code" {
		http.Error(w, "bad authorization request", http.StatusBadRequest)
		return
	}
	code := p.newCode()
	back, err := url.Parse(q.Get("redirect_uri"))
	if err != nil {
		http.Error(w, "bad redirect_uri", http.StatusBadRequest)
		return
	}
	v := back.Query()
	v.Set("code", code)
	v.Set("state", q.Get("state"))
	back.RawQuery = v.Encode()
	http.Redirect(w, r, back.String(), http.StatusFound)
}

func (p *Provider) newCode() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	code := b64(b)
	p.mu.Lock()
	claims := map[string]any{}
	for k, v := range p.Claims {
		claims[k] = v
	}
	p.codes[code] = claims
	p.mu.Unlock()
	return code
}

func (p *Provider) device(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.FormValue("client_id") != p.ClientID {
		http.Error(w, "bad device request", http.StatusBadRequest)
		return
	}
	code := p.newCode()
	writeJSON(w, map[string]any{"device_code": code, "user_code": "WDJB-MJHT", "verification_uri": p.URL + "/activate",
		"verification_uri_complete": p.URL + "/activate?user_code=WDJB-MJHT", "expires_in": 600, "interval": 1})
}

func (p *Provider) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var code string
	switch r.PostForm.Get("grant_type") {
	case "authorization_code":
		id, secret, ok := r.BasicAuth()
		if !ok {
			id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		}
		if id != p.ClientID || secret != p.ClientSecret {
			w.WriteHeader(http.StatusUnauthorized)
			writeJSON(w, map[string]string{"error": "invalid_client"})
			return
		}
		code = r.PostForm.Get("code")
	case "urn:ietf:params:oauth:grant-type:device_code":
		code = r.PostForm.Get("device_code")
		p.mu.Lock()
		p.Polls++
		p.mu.Unlock()
	default:
		w.WriteHeader(http.StatusBadRequest)
		writeJSON(w, map[string]string{"error": "unsupported_grant_type"})
		return
	}
	p.mu.Lock()
	claims, ok := p.codes[code]
	delete(p.codes, code)
	p.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusBadRequest)
		writeJSON(w, map[string]string{"error": "invalid_grant"})
		return
	}
	writeJSON(w, map[string]any{"access_token": "at-" + code, "token_type": "Bearer", "expires_in": 3600, "id_token": p.IDToken(claims)})
}

// IDToken signs an ID token for claims, issued now for the client.
func (p *Provider) IDToken(claims map[string]any) string {
	now := p.now()
	c := map[string]any{"iss": p.URL, "aud": p.ClientID, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	for k, v := range claims {
		c[k] = v
	}
	return p.Sign(c)
}

// Sign makes a compact RS256 JWS of claims with the provider's key.
func (p *Provider) Sign(claims map[string]any) string {
	h, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "k1"})
	body, _ := json.Marshal(claims)
	signing := b64(h) + "." + b64(body)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, p.key, crypto.SHA256, sum[:])
	if err != nil {
		panic(err)
	}
	return signing + "." + b64(sig)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
