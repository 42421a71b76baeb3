package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// postAlert sends one alert to the webhook, retrying a few times.
func (s *Server) postAlert(url string, body any) {
	raw, err := json.Marshal(body)
	if err != nil {
		return
	}
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
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
		time.Sleep(time.Duration(attempt+1) * 2 * time.Second)
	}
}
