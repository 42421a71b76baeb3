package api

// ControlRequest is the optional body of the control calls.
type ControlRequest struct {
	Reason string `json:"reason,omitempty"`
	// Priority is the new priority class (PUT /v1/jobs/{id}/priority).
	Priority string `json:"priority,omitempty"`
}
