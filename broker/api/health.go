package api

// Health is the body of /healthz.
type Health struct {
	Status  string `json:"status"` // ok | unhealthy
	Version string `json:"version"`
	Leader  bool   `json:"leader"`
	// LeaderURL is where the leader is, when brokers elect one.
	LeaderURL string `json:"leaderURL,omitempty"`
	Error     string `json:"error,omitempty"`
}
