package api

import (
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// JoinToken is a stored join token (its secret is not kept).
type JoinToken struct {
	ID        string    `json:"id"`
	CreatedBy string    `json:"createdBy"`
	CreatedAt time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt"`
	// Node, when set, is the only name the token may enrol.
	Node string `json:"node,omitempty"`
	// MaxGPUs is the node class: the most cards a node enrolled with the
	// token may report.
	MaxGPUs int `json:"maxGPUs"`
	// UsedAt and UsedBy are set when an agent exchanged the token.
	UsedAt *time.Time `json:"usedAt,omitempty"`
	UsedBy string     `json:"usedBy,omitempty"`
}

// JoinTokenRequest is the body of POST /v1/jointokens.
type JoinTokenRequest struct {
	// Expires is how long the token lasts, e.g. "1h" (default 1h, at most 7 days).
	Expires broker.Duration `json:"expires,omitempty"`
	Node    string          `json:"node,omitempty"`
	MaxGPUs int             `json:"maxGPUs,omitempty"`
}

// JoinTokenAnswer is the answer: the token's secret, shown this once.
type JoinTokenAnswer struct {
	JoinToken
	Token string `json:"token"`
}
