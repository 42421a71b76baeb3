package agentapi

import "time"

// PathEnrol is where an agent exchanges a join token for its node
// credential. The join token is the request's only authority (no bearer).
const PathEnrol = "/v1/agent/enrol"

// EnrolRequest is the body of POST PathEnrol.
type EnrolRequest struct {
	JoinToken string `json:"joinToken"`
	Node      string `json:"node"`
}

// EnrolResponse carries the node's own credential, bound to its name, and
// the broker's CA bundle for the agent to pin ("" when the broker has
// none configured).
type EnrolResponse struct {
	Node       string    `json:"node"`
	Credential string    `json:"credential"`
	CA         string    `json:"ca,omitempty"`
	IssuedAt   time.Time `json:"issuedAt"`
}
