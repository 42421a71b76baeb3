package api

import "github.com/spillway-dev/spillway/broker"

// TelemetryPage is the body of GET /v1/telemetry.
type TelemetryPage struct {
	Resolution broker.Resolution       `json:"resolution"`
	Points     []broker.TelemetryPoint `json:"points"`
	Truncated  bool                    `json:"truncated,omitempty"`
}
