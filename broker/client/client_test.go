package client

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// A client shared by 8 goroutines keeps their 8 connections open between
// requests: Go's default of 2 idle connections per host made the other 6
// reconnect (a TCP and, with TLS, a handshake) for every request.
func TestSharedClientKeepsItsConnections(t *testing.T) {
	const workers, rounds = 8, 25
	var conns atomic.Int64
	// Each round's 8 requests are answered together, once all 8 are in:
	// every round needs 8 connections at once.
	var mu sync.Mutex
	arrived, release := 0, make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		arrived++
		ch := release
		if arrived == workers {
			close(release)
			arrived, release = 0, make(chan struct{})
		}
		mu.Unlock()
		<-ch
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := New(srv.URL, "t")
	errs := make(chan error, workers*rounds)
	for range rounds {
		// A round ends before the next starts: its connections go idle.
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Health(context.Background()); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := conns.Load(); n > workers {
		t.Fatalf("%d connections for %d requests from %d goroutines; want at most %d", n, workers*rounds, workers, workers)
	}
}
