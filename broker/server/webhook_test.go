package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// newWebhook serves a webhook that forwards each JSON body it receives.
func newWebhook(t *testing.T, got chan<- map[string]any) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		got <- body
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
