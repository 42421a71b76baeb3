package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
)

// Submitted is the broker's answer to a submit: one job, or an array's
// elements when the spec (or the array argument) made an array.
type Submitted struct {
	Job   *broker.Job
	Array *api.ArraySubmitted
}

// SubmitArray sends a job spec (YAML or JSON) with an optional array of
// indexes ("0-999"; "" keeps the spec's own array field, if any) in one
// call, and returns the one job or the array made.
func (c *Client) SubmitArray(ctx context.Context, spec []byte, array string) (*Submitted, error) {
	ct := "application/yaml"
	if t := bytes.TrimSpace(spec); len(t) > 0 && t[0] == '{' {
		ct = "application/json"
	}
	path := "/v1/jobs"
	if array != "" {
		path += "?array=" + url.QueryEscape(array)
	}
	var raw json.RawMessage
	if err := c.getJSON(ctx, http.MethodPost, path, bytes.NewReader(spec), ct, &raw); err != nil {
		return nil, err
	}
	var probe struct {
		ArrayID string `json:"arrayId"`
		Jobs    any    `json:"jobs"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("decode submit answer: %w", err)
	}
	out := &Submitted{}
	if probe.ArrayID != "" && probe.Jobs != nil {
		out.Array = &api.ArraySubmitted{}
		if err := json.Unmarshal(raw, out.Array); err != nil {
			return nil, fmt.Errorf("decode submit answer: %w", err)
		}
		return out, nil
	}
	out.Job = &broker.Job{}
	if err := json.Unmarshal(raw, out.Job); err != nil {
		return nil, fmt.Errorf("decode submit answer: %w", err)
	}
	return out, nil
}

// CancelArray cancels every element of an array that has not ended.
func (c *Client) CancelArray(ctx context.Context, arrayID string) (*api.ArrayCancelled, error) {
	var out api.ArrayCancelled
	if err := c.getJSON(ctx, http.MethodPost, "/v1/arrays/"+url.PathEscape(arrayID)+"/cancel", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SubmitArraySpec sends a Spec value as an array of the given indexes.
func (c *Client) SubmitArraySpec(ctx context.Context, s broker.Spec, array string) (*Submitted, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return c.SubmitArray(ctx, raw, array)
}

// Array is one array at a glance: its elements by state, those waiting
// and why.
func (c *Client) Array(ctx context.Context, arrayID string) (*api.ArrayView, error) {
	var out api.ArrayView
	if err := c.getJSON(ctx, http.MethodGet, "/v1/arrays/"+url.PathEscape(arrayID), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ArrayControl holds ("hold") or releases ("release") every waiting
// element of an array.
func (c *Client) ArrayControl(ctx context.Context, arrayID, action, reason string) (*api.ArrayChanged, error) {
	raw, _ := json.Marshal(api.ControlRequest{Reason: reason})
	var out api.ArrayChanged
	if err := c.getJSON(ctx, http.MethodPost, "/v1/arrays/"+url.PathEscape(arrayID)+"/"+action, bytes.NewReader(raw), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetArrayLimit sets the most elements of an array running at once (0:
// no limit).
func (c *Client) SetArrayLimit(ctx context.Context, arrayID string, limit int, reason string) (*api.ArrayChanged, error) {
	raw, _ := json.Marshal(api.ArrayLimitRequest{Limit: &limit, Reason: reason})
	var out api.ArrayChanged
	if err := c.getJSON(ctx, http.MethodPut, "/v1/arrays/"+url.PathEscape(arrayID)+"/limit", bytes.NewReader(raw), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}
