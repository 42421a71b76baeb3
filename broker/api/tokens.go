package api

// TokenView is one token as GET /v1/tokens lists it: never the secret.
type TokenView struct {
	Name    string `json:"name"`
	Role    string `json:"role"`
	Team    string `json:"team,omitempty"`
	Revoked bool   `json:"revoked"`
}
