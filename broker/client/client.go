// Package client is the Go client of the broker's /v1 API, used by the
// spillway CLI and the integration tests.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/wire"
)

// Client talks to one broker.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
}

// New returns a client for the broker at baseURL.
func New(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token,
		HTTP: &http.Client{CheckRedirect: wire.RedirectPolicy(nil), Transport: newTransport()}}
}

// idleConnsPerHost is how many idle keep-alive connections a client keeps
// to its broker. Go's default is 2: a client shared by more goroutines
// (parallel submitters, a dashboard) closed all but two connections after
// each round of requests and opened them again, a TCP (and with TLS a
// handshake) per request.
const idleConnsPerHost = 64

func newTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idleConnsPerHost
	tr.MaxIdleConns = max(tr.MaxIdleConns, idleConnsPerHost)
	return tr
}

// APIError is an error answer of the API.
type APIError struct {
	Status  int
	Code    string
	Message string
	Field   string
	// Details lists every invalid field when there is more than one.
	Details []broker.FieldError
}

func (e *APIError) Error() string {
	if len(e.Details) > 1 {
		lines := make([]string, 0, len(e.Details)+1)
		lines = append(lines, fmt.Sprintf("%d problems:", len(e.Details)))
		for _, d := range e.Details {
			lines = append(lines, "  "+d.Error())
		}
		return strings.Join(lines, "\n")
	}
	if e.Field != "" && !strings.HasPrefix(e.Message, e.Field) {
		return fmt.Sprintf("%s: %s", e.Field, e.Message)
	}
	return e.Message
}

// IsNotFound reports whether err is a 404 from the API.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	return c.doHeader(ctx, method, path, body, contentType, nil)
}

func (c *Client) doHeader(ctx context.Context, method, path string, body io.Reader, contentType string, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, fmt.Errorf("reach broker at %s: %w", c.BaseURL, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb struct {
		Error struct {
			Code, Message, Field string
			Details              []broker.FieldError
		} `json:"error"`
	}
	ae := &APIError{Status: resp.StatusCode, Code: http.StatusText(resp.StatusCode), Message: strings.TrimSpace(string(raw))}
	if json.Unmarshal(raw, &eb) == nil && eb.Error.Message != "" {
		ae.Code, ae.Message, ae.Field, ae.Details = eb.Error.Code, eb.Error.Message, eb.Error.Field, eb.Error.Details
	}
	return nil, ae
}

func (c *Client) getJSON(ctx context.Context, method, path string, body io.Reader, contentType string, out any) error {
	resp, err := c.do(ctx, method, path, body, contentType)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

// Submit sends a job spec (YAML or JSON).
func (c *Client) Submit(ctx context.Context, spec []byte) (*broker.Job, error) {
	var j broker.Job
	ct := "application/yaml"
	if t := bytes.TrimSpace(spec); len(t) > 0 && t[0] == '{' {
		ct = "application/json"
	}
	// One key for every try: a submit whose answer was lost (a timeout,
	// a broker restart) is sent again and gets the same job back.
	hdr := http.Header{"Idempotency-Key": {newIdempotencyKey()}}
	var err error
	for try := 0; try < submitTries; try++ {
		var resp *http.Response
		resp, err = c.doHeader(ctx, http.MethodPost, "/v1/jobs", bytes.NewReader(spec), ct, hdr)
		if err == nil {
			defer resp.Body.Close()
			if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
				return nil, fmt.Errorf("decode submit answer: %w", err)
			}
			return &j, nil
		}
		var ae *APIError
		if errors.As(err, &ae) || ctx.Err() != nil {
			return nil, err
		}
	}
	return nil, err
}

// submitTries is how often Submit sends a spec whose answer did not
// arrive (the same Idempotency-Key each time).
const submitTries = 3

func newIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SubmitSpec sends a Spec value.
func (c *Client) SubmitSpec(ctx context.Context, s broker.Spec) (*broker.Job, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return c.Submit(ctx, raw)
}

// Job fetches one job with its history.
func (c *Client) Job(ctx context.Context, id string) (*broker.Job, error) {
	var j broker.Job
	if err := c.getJSON(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, "", &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// ListOptions filter a job listing.
type ListOptions struct {
	States []broker.State
	Team   string
	Queue  string
	Limit  int
	Cursor string
	// Array lists only this array's elements.
	Array string
	// FoldArrays lists an array's waiting elements as one (JobList.Arrays).
	FoldArrays bool
}

// Jobs lists one page of jobs, newest first.
func (c *Client) Jobs(ctx context.Context, o ListOptions) (*api.JobList, error) {
	q := url.Values{}
	if len(o.States) > 0 {
		parts := make([]string, len(o.States))
		for i, s := range o.States {
			parts[i] = string(s)
		}
		q.Set("state", strings.Join(parts, ","))
	}
	if o.Team != "" {
		q.Set("team", o.Team)
	}
	if o.Queue != "" {
		q.Set("queue", o.Queue)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	if o.Array != "" {
		q.Set("arrayId", o.Array)
	}
	if o.FoldArrays {
		q.Set("foldArrays", "true")
	}
	var out api.JobList
	path := "/v1/jobs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	if err := c.getJSON(ctx, http.MethodGet, path, nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Cancel asks the broker to cancel a job.
func (c *Client) Cancel(ctx context.Context, id string) (*broker.Job, error) {
	var j broker.Job
	if err := c.getJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel", nil, "", &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// LogOptions select what Logs streams.
type LogOptions struct {
	Follow  bool
	Tail    int // -1: whole log
	Attempt int // 0: latest
}

// Logs copies a job's log to w; with Follow it returns when the job ends.
func (c *Client) Logs(ctx context.Context, id string, o LogOptions, w io.Writer) error {
	q := url.Values{}
	if o.Follow {
		q.Set("follow", "true")
	}
	if o.Tail >= 0 {
		q.Set("tail", strconv.Itoa(o.Tail))
	}
	if o.Attempt > 0 {
		q.Set("attempt", strconv.Itoa(o.Attempt))
	}
	path := "/v1/jobs/" + url.PathEscape(id) + "/logs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.do(ctx, http.MethodGet, path, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// Nodes lists the nodes with their cards.
func (c *Client) Nodes(ctx context.Context) ([]api.NodeView, error) {
	var out struct {
		Nodes []api.NodeView `json:"nodes"`
	}
	if err := c.getJSON(ctx, http.MethodGet, "/v1/nodes", nil, "", &out); err != nil {
		return nil, err
	}
	return out.Nodes, nil
}

// Whoami tells who the token is.
func (c *Client) Whoami(ctx context.Context) (*api.Whoami, error) {
	var out api.Whoami
	if err := c.getJSON(ctx, http.MethodGet, "/v1/whoami", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Health reads /healthz.
func (c *Client) Health(ctx context.Context) (*api.Health, error) {
	var out api.Health
	if err := c.getJSON(ctx, http.MethodGet, "/healthz", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// BillingQuery selects a billing report or export.
type BillingQuery struct {
	Month       string // YYYY-MM; or From/To
	From, To    string
	Team        string
	By          string // report dimensions, comma-separated
	Format      string // export: csv or json
	Granularity string // export: entry, hour or day
}

func (q BillingQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"month": q.Month, "from": q.From, "to": q.To, "team": q.Team, "by": q.By,
		"format": q.Format, "granularity": q.Granularity} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// Usage fetches a billing report.
func (c *Client) Usage(ctx context.Context, q BillingQuery) (*billing.Report, error) {
	var rep billing.Report
	if err := c.getJSON(ctx, http.MethodGet, "/v1/billing/usage?"+q.values().Encode(), nil, "", &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// Export copies a billing export to w.
func (c *Client) Export(ctx context.Context, q BillingQuery, w io.Writer) error {
	resp, err := c.do(ctx, http.MethodGet, "/v1/billing/export?"+q.values().Encode(), nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// Instances lists the burst machines.
func (c *Client) Instances(ctx context.Context) ([]api.InstanceView, error) {
	var out struct {
		Instances []api.InstanceView `json:"instances"`
	}
	if err := c.getJSON(ctx, http.MethodGet, "/v1/instances", nil, "", &out); err != nil {
		return nil, err
	}
	return out.Instances, nil
}

// Offers lists the burst offers as the controller sees them, with the
// reason any is skipped.
func (c *Client) Offers(ctx context.Context) ([]api.OfferView, error) {
	var out struct {
		Offers []api.OfferView `json:"offers"`
	}
	if err := c.getJSON(ctx, http.MethodGet, "/v1/offers", nil, "", &out); err != nil {
		return nil, err
	}
	return out.Offers, nil
}

// RefreshPrices has the broker read on-demand prices from the clouds'
// price lists (operator); provider "" refreshes every provider that has
// one.
func (c *Client) RefreshPrices(ctx context.Context, provider string) ([]api.PriceRefresh, error) {
	var out struct {
		Refreshed []api.PriceRefresh `json:"refreshed"`
	}
	path := "/v1/offers/refresh"
	if provider != "" {
		path += "?provider=" + url.QueryEscape(provider)
	}
	if err := c.getJSON(ctx, http.MethodPost, path, nil, "", &out); err != nil {
		return nil, err
	}
	return out.Refreshed, nil
}

// ClearPrices drops the refreshed price tables (operator): on-demand
// offers take their configured prices again. It returns the providers
// whose table was dropped.
func (c *Client) ClearPrices(ctx context.Context, provider string) ([]string, error) {
	var out struct {
		Cleared []string `json:"cleared"`
	}
	path := "/v1/offers/prices"
	if provider != "" {
		path += "?provider=" + url.QueryEscape(provider)
	}
	if err := c.getJSON(ctx, http.MethodDelete, path, nil, "", &out); err != nil {
		return nil, err
	}
	return out.Cleared, nil
}

// Instance describes one burst machine.
func (c *Client) Instance(ctx context.Context, id string) (*api.InstanceView, error) {
	var out api.InstanceView
	if err := c.getJSON(ctx, http.MethodGet, "/v1/instances/"+url.PathEscape(id), nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// BurstPlan returns what the burst controller would do now.
func (c *Client) BurstPlan(ctx context.Context) (*api.BurstPlan, error) {
	var out api.BurstPlan
	if err := c.getJSON(ctx, http.MethodGet, "/v1/burst/plan", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Budgets lists the burst budgets with this month's money.
func (c *Client) Budgets(ctx context.Context) ([]api.BudgetView, error) {
	var out struct {
		Budgets []api.BudgetView `json:"budgets"`
	}
	if err := c.getJSON(ctx, http.MethodGet, "/v1/budgets", nil, "", &out); err != nil {
		return nil, err
	}
	return out.Budgets, nil
}

// SetBudget sets a scope's monthly burst budget ("global" or a team).
func (c *Client) SetBudget(ctx context.Context, scope, limit string) (*broker.Budget, error) {
	raw, _ := json.Marshal(api.BudgetRequest{Limit: limit})
	var out broker.Budget
	if err := c.getJSON(ctx, http.MethodPut, "/v1/budgets/"+url.PathEscape(scope), bytes.NewReader(raw), "application/json", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Queues returns every queue with its load and the head of its waiting
// jobs: at most limit a queue (0: the broker's default, 100), with the
// count of the rest in WaitingMore.
func (c *Client) Queues(ctx context.Context, limit int) ([]api.QueueView, error) {
	var out struct {
		Queues []api.QueueView `json:"queues"`
	}
	path := "/v1/queues"
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	if err := c.getJSON(ctx, http.MethodGet, path, nil, "", &out); err != nil {
		return nil, err
	}
	return out.Queues, nil
}
