package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/spillway-dev/spillway/broker/server"
)

// CreateJoinToken asks for a single-use join token (operators).
func (c *Client) CreateJoinToken(ctx context.Context, req server.JoinTokenRequest) (*server.JoinTokenAnswer, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out server.JoinTokenAnswer
	if err := c.getJSON(ctx, http.MethodPost, "/v1/jointokens", bytes.NewReader(raw), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// JoinTokens lists the join tokens, used or not (operators).
func (c *Client) JoinTokens(ctx context.Context) ([]server.JoinToken, error) {
	var out struct {
		Tokens []server.JoinToken `json:"tokens"`
	}
	if err := c.getJSON(ctx, http.MethodGet, "/v1/jointokens", nil, "", &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// RevokeNode revokes every credential of a node (operators).
func (c *Client) RevokeNode(ctx context.Context, name string) ([]string, error) {
	var out struct {
		Revoked []string `json:"revoked"`
	}
	if err := c.getJSON(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+"/revoke", nil, "", &out); err != nil {
		return nil, err
	}
	return out.Revoked, nil
}
