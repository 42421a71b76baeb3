package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
)

func (h *harness) submitCode(token, spec string) (int, http.Header) {
	h.t.Helper()
	req, _ := http.NewRequest("POST", h.http.URL+"/v1/jobs", strings.NewReader(spec))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// TestFinding6TeamSubmitRate: a team past its submit rate gets 429 with
// Retry-After; another team submits and lists as before; the bucket
// refills with the (injected) clock.
func TestFinding6TeamSubmitRate(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Limits.SubmitsPerMinute, h.srv.cfg().Limits.SubmitBurst = 60, 5
	for i := 0; i < 5; i++ {
		if code, _ := h.submitCode(tokAlice, oneGPU); code != http.StatusCreated {
			t.Fatalf("submit %d within the burst: %d", i, code)
		}
	}
	code, hdr := h.submitCode(tokAlice, oneGPU)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") != "1" {
		t.Fatalf("submit past the burst: %d Retry-After %q", code, hdr.Get("Retry-After"))
	}
	if code, _ := h.submitCode(tokBob, oneGPU); code != http.StatusCreated {
		t.Fatalf("the other team's submit: %d", code)
	}
	var list api.JobList
	if code := h.do("GET", "/v1/jobs?limit=10", tokBob, nil, &list); code != http.StatusOK || len(list.Jobs) != 1 || list.Jobs[0].Spec.Team != "vision" {
		t.Fatalf("the other team's listing: %d %d jobs", code, len(list.Jobs))
	}
	h.clock.Step(time.Second)
	if code, _ := h.submitCode(tokAlice, oneGPU); code != http.StatusCreated {
		t.Fatalf("after a second's refill: %d", code)
	}
	if code, _ := h.submitCode(tokAlice, oneGPU); code != http.StatusTooManyRequests {
		t.Fatalf("refill gave more than one: %d", code)
	}
}

// TestFinding6PendingCap: a team at its pending cap gets 429 until a job
// leaves pending; the cap counts only that team.
func TestFinding6PendingCap(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Limits.MaxPendingPerTeam = 3
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, h.submit(tokAlice, oneGPU).ID)
	}
	code, hdr := h.submitCode(tokAlice, oneGPU)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("submit at the cap: %d %q", code, hdr.Get("Retry-After"))
	}
	if code, _ := h.submitCode(tokBob, oneGPU); code != http.StatusCreated {
		t.Fatalf("other team at alice's cap: %d", code)
	}
	if code := h.do("POST", "/v1/jobs/"+ids[0]+"/cancel", tokAlice, nil, nil); code/100 != 2 {
		t.Fatalf("cancel: %d", code)
	}
	if code, _ := h.submitCode(tokAlice, oneGPU); code != http.StatusCreated {
		t.Fatalf("after a cancel: %d", code)
	}
	// The count survives a restart.
	h.restart()
	h.srv.cfg().Limits.MaxPendingPerTeam = 3
	if code, _ := h.submitCode(tokAlice, oneGPU); code != http.StatusTooManyRequests {
		t.Fatalf("after a restart at the cap: %d", code)
	}
}

// TestArrayPastPendingCap: an array that fits beside the team's pending
// jobs only later gets 429 (wait and retry); one larger than the cap
// itself can never fit and gets 400 naming the field, the limit and what
// to do, with no Retry-After; neither stores anything.
func TestArrayPastPendingCap(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Limits.MaxPendingPerTeam = 4
	h.submit(tokAlice, oneGPU)
	var e struct {
		Error struct {
			Field, Code, Message string
		} `json:"error"`
	}
	spec := `{"resources":{"gpus":1},"timeout":"1h","command":["true"]}`
	if code := h.do("POST", "/v1/jobs?array=0-3", tokAlice, spec, &e); code != http.StatusTooManyRequests ||
		!strings.Contains(e.Error.Message, "team nlp has 1 pending jobs and asks for 4 more; limits.maxPendingPerTeam allows 4") {
		t.Fatalf("array of 4 beside 1 pending, cap 4: %d %+v", code, e)
	}
	req, _ := http.NewRequest("POST", h.http.URL+"/v1/jobs?array=0-4", strings.NewReader(spec))
	req.Header.Set("Authorization", "Bearer "+tokAlice)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Retry-After") != "" || e.Error.Field != "array" ||
		e.Error.Code != broker.CodeOutOfRange || !strings.Contains(e.Error.Message, "has 5 elements, more than the 4 pending jobs limits.maxPendingPerTeam allows a team; submit it in parts of at most 4") {
		t.Fatalf("array of 5, cap 4: %d %q %+v", resp.StatusCode, resp.Header.Get("Retry-After"), e)
	}
	var l api.JobList
	h.do("GET", "/v1/jobs", tokAdmin, nil, &l)
	if len(l.Jobs) != 1 {
		t.Fatalf("%d jobs stored, want the one lone job", len(l.Jobs))
	}
}

// serveLoopback runs the broker's real HTTP server on 127.0.0.1.
func serveLoopback(t *testing.T, h *harness) string {
	t.Helper()
	h.srv.cfg().TLS.Insecure = true
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}

// closedWithin waits (generously) for the server to close conn.
func closedWithin(conn net.Conn, d time.Duration) (string, bool) {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	raw, err := io.ReadAll(bufio.NewReader(conn))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return string(raw), false
	}
	return string(raw), true
}

// TestFinding7SlowRequests: a body sent slower than limits.readTimeout and
// headers slower than limits.readHeaderTimeout are cut off; the
// connection does not stay held.
func TestFinding7SlowRequests(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Limits.ReadTimeout = broker.Duration(300 * time.Millisecond)
	h.srv.cfg().Limits.ReadHeaderTimeout = broker.Duration(300 * time.Millisecond)
	addr := serveLoopback(t, h)

	slowBody, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slowBody.Close()
	fmt.Fprintf(slowBody, "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", tokAlice)
	// Trickle nothing more: the broker must give up on the body.
	out, closed := closedWithin(slowBody, 20*time.Second)
	if !closed {
		t.Fatal("a request whose body never arrives still holds its connection after 20s")
	}
	if !strings.Contains(out, " 400 ") && out != "" {
		t.Fatalf("slow body answer: %q", out)
	}

	slowHeaders, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slowHeaders.Close()
	fmt.Fprintf(slowHeaders, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	if _, closed := closedWithin(slowHeaders, 20*time.Second); !closed {
		t.Fatal("a request whose headers never end still holds its connection after 20s")
	}
}

// TestBodyCapEveryRoute: a body over limits.maxBodyBytes is refused on a
// route without a cap of its own.
func TestBodyCapEveryRoute(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Limits.MaxBodyBytes = broker.Quantity(2 << 10)
	big := `{"limit": "` + strings.Repeat("1", 4<<10) + `"}`
	if code := h.do("PUT", "/v1/budgets/global", tokAdmin, big, nil); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("big budget body: %d", code)
	}
	if code := h.do("PUT", "/v1/budgets/global", tokAdmin, `{"limit": "100"}`, nil); code != http.StatusOK {
		t.Fatalf("small budget body: %d", code)
	}
}
