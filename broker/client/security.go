package client

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
)

// CreateJoinToken asks for a single-use join token (operators).
func (c *Client) CreateJoinToken(ctx context.Context, req api.JoinTokenRequest) (*api.JoinTokenAnswer, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out api.JoinTokenAnswer
	if err := c.getJSON(ctx, http.MethodPost, "/v1/jointokens", bytes.NewReader(raw), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// JoinTokens lists the join tokens, used or not (operators).
func (c *Client) JoinTokens(ctx context.Context) ([]api.JoinToken, error) {
	var out struct {
		Tokens []api.JoinToken `json:"tokens"`
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

// AuditQuery selects audit records.
type AuditQuery struct {
	From, To, By string
	Limit        int
	// Format "csv" is the export.
	Format string
}

func (q AuditQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"from": q.From, "to": q.To, "by": q.By, "format": q.Format} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// Audit reads audit records (operators, finance).
func (c *Client) Audit(ctx context.Context, q AuditQuery) ([]broker.AuditRecord, error) {
	q.Format = ""
	var out struct {
		Audit []broker.AuditRecord `json:"audit"`
	}
	if err := c.getJSON(ctx, http.MethodGet, "/v1/audit?"+q.values().Encode(), nil, "", &out); err != nil {
		return nil, err
	}
	return out.Audit, nil
}

// AuditExport streams the audit log as CSV to w.
func (c *Client) AuditExport(ctx context.Context, q AuditQuery, w io.Writer) error {
	q.Format = "csv"
	resp, err := c.do(ctx, http.MethodGet, "/v1/audit?"+q.values().Encode(), nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// LoginConfig reads how to log in with the broker's OIDC provider.
func (c *Client) LoginConfig(ctx context.Context) (*api.LoginConfig, error) {
	var out api.LoginConfig
	if err := c.getJSON(ctx, http.MethodGet, "/v1/login", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Login exchanges the provider's ID token for a broker session.
func (c *Client) Login(ctx context.Context, idToken string) (*api.LoginAnswer, error) {
	raw, err := json.Marshal(api.LoginRequest{IDToken: idToken})
	if err != nil {
		return nil, err
	}
	var out api.LoginAnswer
	if err := c.getJSON(ctx, http.MethodPost, "/v1/login", bytes.NewReader(raw), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}
