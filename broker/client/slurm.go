package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/spillway-dev/spillway/broker/api"
)

// SlurmResume asks the broker for machines behind Slurm nodes (what
// slurm.conf's ResumeProgram runs).
func (c *Client) SlurmResume(ctx context.Context, req api.SlurmRequest) (*api.SlurmResult, error) {
	return c.slurm(ctx, "/v1/slurm/resume", req)
}

// SlurmSuspend asks the broker to end the machines behind Slurm nodes
// (what slurm.conf's SuspendProgram runs).
func (c *Client) SlurmSuspend(ctx context.Context, req api.SlurmRequest) (*api.SlurmResult, error) {
	return c.slurm(ctx, "/v1/slurm/suspend", req)
}

func (c *Client) slurm(ctx context.Context, path string, req api.SlurmRequest) (*api.SlurmResult, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out api.SlurmResult
	if err := c.getJSON(ctx, http.MethodPost, path, bytes.NewReader(raw), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}
