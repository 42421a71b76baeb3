package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/spillway-dev/spillway/broker/api"
)

// Explain fetches the troubleshooting walk of a job and its verdict.
func (c *Client) Explain(ctx context.Context, id string) (*api.Explanation, error) {
	var x api.Explanation
	if err := c.getJSON(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id)+"/explain", nil, "", &x); err != nil {
		return nil, err
	}
	return &x, nil
}

// ReportQuery selects a utilisation or delivery report.
type ReportQuery struct {
	Month    string // YYYY-MM; or From/To
	From, To string
	Team     string
	// Resolution of the telemetry read: m or h ("" chooses).
	Resolution string
	// Table is the CSV table: rows, jobs or cards.
	Table string
}

func (q ReportQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"month": q.Month, "from": q.From, "to": q.To, "team": q.Team, "resolution": q.Resolution, "table": q.Table} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// Utilization fetches the utilisation report.
func (c *Client) Utilization(ctx context.Context, q ReportQuery) (*api.UtilizationReport, error) {
	var rep api.UtilizationReport
	if err := c.getJSON(ctx, http.MethodGet, "/v1/reports/utilization?"+q.values().Encode(), nil, "", &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// UtilizationCSV copies one table of the utilisation report, as CSV, to w.
func (c *Client) UtilizationCSV(ctx context.Context, q ReportQuery, w io.Writer) error {
	v := q.values()
	v.Set("format", "csv")
	resp, err := c.do(ctx, http.MethodGet, "/v1/reports/utilization?"+v.Encode(), nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// Delivery fetches the delivery report.
func (c *Client) Delivery(ctx context.Context, q ReportQuery) (*api.DeliveryReport, error) {
	var rep api.DeliveryReport
	if err := c.getJSON(ctx, http.MethodGet, "/v1/reports/delivery?"+q.values().Encode(), nil, "", &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// ReportUnits records units of output for a job.
func (c *Client) ReportUnits(ctx context.Context, job string, r api.UnitsRequest) (*api.UnitsAnswer, error) {
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var ans api.UnitsAnswer
	if err := c.getJSON(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(job)+"/units", bytes.NewReader(raw), "application/json", &ans); err != nil {
		return nil, err
	}
	return &ans, nil
}

// Backup copies a consistent snapshot of the broker's embedded store to w
// and returns its size; a copy cut short is an error.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/store/backup", nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("copy store: %w", err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("copy store: got %d of %d bytes", n, resp.ContentLength)
	}
	return n, nil
}
