package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/spillway-dev/spillway/broker/api"
)

// ReportCheckpoint tells the broker the job saved its work at step (POST
// /v1/jobs/{id}/checkpoint); inside a job, with its job token.
func (c *Client) ReportCheckpoint(ctx context.Context, job string, step int64) (*api.CheckpointAnswer, error) {
	raw, err := json.Marshal(api.CheckpointReport{Step: step})
	if err != nil {
		return nil, err
	}
	var ans api.CheckpointAnswer
	if err := c.getJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(job)+"/checkpoint", bytes.NewReader(raw), "application/json", &ans); err != nil {
		return nil, err
	}
	return &ans, nil
}
