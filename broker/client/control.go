package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
)

// NodeControl cordons, drains or undrains a node (action "cordon",
// "drain", "undrain"; operator).
func (c *Client) NodeControl(ctx context.Context, name, action, reason string) (*broker.Node, error) {
	raw, _ := json.Marshal(api.ControlRequest{Reason: reason})
	var out broker.Node
	err := c.getJSON(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/"+action, bytes.NewReader(raw), "application/json", &out)
	return &out, err
}

// JobControl holds or releases a job (action "hold", "release").
func (c *Client) JobControl(ctx context.Context, id, action, reason string) (*broker.Job, error) {
	raw, _ := json.Marshal(api.ControlRequest{Reason: reason})
	var out broker.Job
	err := c.getJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/"+action, bytes.NewReader(raw), "application/json", &out)
	return &out, err
}

// SetPriority changes a job's priority class (operator).
func (c *Client) SetPriority(ctx context.Context, id, priority, reason string) (*broker.Job, error) {
	raw, _ := json.Marshal(api.ControlRequest{Priority: priority, Reason: reason})
	var out broker.Job
	err := c.getJSON(ctx, http.MethodPut, "/v1/jobs/"+url.PathEscape(id)+"/priority", bytes.NewReader(raw), "application/json", &out)
	return &out, err
}

// Tokens lists the auth tokens in force (operator).
func (c *Client) Tokens(ctx context.Context) ([]api.TokenView, error) {
	var out struct {
		Tokens []api.TokenView `json:"tokens"`
	}
	err := c.getJSON(ctx, http.MethodGet, "/v1/tokens", nil, "", &out)
	return out.Tokens, err
}

// RevokeToken refuses the named token from now on (operator).
func (c *Client) RevokeToken(ctx context.Context, name string) error {
	var out api.TokenView
	return c.getJSON(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(name), nil, "", &out)
}
