package api

// Principal is who is calling: the name and role of their token, and their
// team for role user.
type Principal struct {
	Name string `json:"name"`
	Role string `json:"role"`
	Team string `json:"team,omitempty"`
	// Node binds a per-machine agent token to the one node it may speak
	// for ("" for cluster-wide agent tokens from the config).
	Node string `json:"node,omitempty"`
	// Credential is the node credential's id (enrolled nodes), and
	// MaxGPUs the most cards its node may report.
	Credential string `json:"credential,omitempty"`
	MaxGPUs    int    `json:"maxGPUs,omitempty"`
}
