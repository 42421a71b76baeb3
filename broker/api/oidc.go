package api

import "time"

// LoginConfig is GET /v1/login: what a client needs to start a login.
type LoginConfig struct {
	Issuer                      string   `json:"issuer"`
	ClientID                    string   `json:"clientID"`
	DeviceAuthorizationEndpoint string   `json:"deviceAuthorizationEndpoint,omitempty"`
	TokenEndpoint               string   `json:"tokenEndpoint"`
	Scopes                      []string `json:"scopes"`
}

// LoginRequest is POST /v1/login: the ID token the client got.
type LoginRequest struct {
	IDToken string `json:"idToken"`
}

// LoginAnswer is the broker's session for the person.
type LoginAnswer struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expiresAt"`
	Principal Principal `json:"principal"`
}
