package agent

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSyncFollowsRedirectToLeader: an agent pointed at a standby reaches
// the leader on another host, named among its peers, with its body and
// token intact; a host not among them gets no token (finding 4).
func TestSyncFollowsRedirectToLeader(t *testing.T) {
	var gotAuth, gotBody string
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		io.WriteString(w, `{}`)
	}))
	defer leader.Close()
	leaderURL := strings.Replace(leader.URL, "127.0.0.1", "localhost", 1)
	standby := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", leaderURL+r.RequestURI)
		w.WriteHeader(http.StatusTemporaryRedirect)
	}))
	defer standby.Close()
	body := `{"node":"n1","generation":3}`
	req, _ := http.NewRequest(http.MethodPost, standby.URL+"/v1/agent/sync", bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer agent-token")
	resp, err := brokerHTTP([]string{leaderURL}, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || gotBody != body || gotAuth != "Bearer agent-token" {
		t.Fatalf("leader answered %d, got %q with Authorization %q", resp.StatusCode, gotBody, gotAuth)
	}
	req, _ = http.NewRequest(http.MethodPost, standby.URL+"/v1/agent/sync", bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer agent-token")
	resp, err = brokerHTTP(nil, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if gotAuth != "" {
		t.Fatalf("token sent to %s, a host that is not a peer: %q", leaderURL, gotAuth)
	}
}
