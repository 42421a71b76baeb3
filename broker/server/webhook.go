package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// postAlert sends one alert to the webhook, retrying a few times while
// ctx (the leader term's) lives.
func (s *Server) postAlert(ctx context.Context, url string, body any) {
	raw, err := json.Marshal(body)
	if err != nil {
		return
	}
	for attempt := 0; attempt < 3; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		req, err := http.NewRequestWithContext(actx, http.MethodPost, url, bytes.NewReader(raw))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			var resp *http.Response
			resp, err = http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					cancel()
					return
				}
			}
		}
		cancel()
		s.log.Warn("alert webhook failed", "url", url, "attempt", attempt+1, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(attempt+1) * 2 * time.Second): // pacing, not ordering
		}
	}
}
