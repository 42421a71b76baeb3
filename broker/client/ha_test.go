package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
)

// TestSubmitFollowsRedirectToLeader: a standby's 307 to the leader on
// another host, a named peer, keeps the method, the body and the bearer
// token.
func TestSubmitFollowsRedirectToLeader(t *testing.T) {
	var gotAuth, gotBody, gotMethod string
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotMethod = r.Header.Get("Authorization"), r.Method
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"J1","state":"pending"}`)
	}))
	defer leader.Close()
	// "localhost" is another host than the leader's 127.0.0.1 for Go's
	// redirect rules, as a second machine would be.
	leaderURL := strings.Replace(leader.URL, "127.0.0.1", "localhost", 1)
	standby := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", leaderURL+r.RequestURI)
		w.WriteHeader(http.StatusTemporaryRedirect)
	}))
	defer standby.Close()

	spec := `{"resources":{"gpus":1},"command":["true"]}`
	cl := New(standby.URL, "tok-0123456789abcdef")
	cl.TrustPeers([]string{leaderURL})
	j, err := cl.Submit(context.Background(), []byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	if j.ID != "J1" || j.State != broker.StatePending {
		t.Fatalf("job %+v", j)
	}
	if gotMethod != http.MethodPost || gotBody != spec || gotAuth != "Bearer tok-0123456789abcdef" {
		t.Fatalf("leader got %s %q with Authorization %q", gotMethod, gotBody, gotAuth)
	}
}

// TestRetriesWhileNoLeader: 503 with Retry-After (an election) is sent
// again, body and all, until a leader answers.
func TestRetriesWhileNoLeader(t *testing.T) {
	var calls int
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		if calls < 3 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"no_leader","message":"no broker leads right now"}}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"J2","state":"pending"}`)
	}))
	defer srv.Close()
	j, err := New(srv.URL, "tok").Submit(context.Background(), []byte(`{"command":["true"]}`))
	if err != nil || j.ID != "J2" {
		t.Fatalf("submit = %+v, %v", j, err)
	}
	if calls != 3 || bodies[0] != bodies[2] || bodies[2] != `{"command":["true"]}` {
		t.Fatalf("%d calls, bodies %q", calls, bodies)
	}
	// Without Retry-After a 503 is an answer.
	calls = 0
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer plain.Close()
	if _, err := New(plain.URL, "tok").Job(context.Background(), "J1"); err == nil || calls != 1 {
		t.Fatalf("plain 503: %v after %d calls", err, calls)
	}
}
