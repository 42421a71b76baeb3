package server

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/report"
	"github.com/spillway-dev/spillway/broker/sched"
)

// TestArraySubmit: one call with array 0-9 makes ten jobs, each its own
// job with its index in SPILLWAY_ARRAY_INDEX, its own history and its own
// ledger lines; the elements survive a restart.
func TestArraySubmit(t *testing.T) {
	h := newHarness(t)
	a := h.agent("node-a", 8)
	var out api.ArraySubmitted
	spec := `{"name":"sweep","resources":{"gpus":1},"timeout":"1h","command":["python","eval.py"],"array":"0-9"}`
	if code := h.do("POST", "/v1/jobs", tokAlice, spec, &out); code != http.StatusCreated {
		t.Fatalf("submit array: %d", code)
	}
	if out.ArrayID == "" || out.Count != 10 || len(out.Jobs) != 10 || !slices.Equal(out.Indexes, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Fatalf("answer %+v", out)
	}
	for k, id := range out.Jobs {
		j := h.job(id)
		if j.ArrayID != out.ArrayID || j.ArrayIndex == nil || *j.ArrayIndex != k || j.Spec.Array != "" || j.Spec.Team != "nlp" {
			t.Fatalf("element %d: %+v", k, j)
		}
	}
	h.cycle()
	resp := a.sync()
	if len(resp.Start) != 8 {
		t.Fatalf("%d starts in one sync answer, want 8 (every free card)", len(resp.Start))
	}
	byJob := map[string]string{}
	for _, st := range resp.Start {
		byJob[st.Job] = st.Env["SPILLWAY_ARRAY_INDEX"]
		if st.Env["SPILLWAY_ARRAY_JOB_ID"] != out.ArrayID {
			t.Fatalf("SPILLWAY_ARRAY_JOB_ID %q", st.Env["SPILLWAY_ARRAY_JOB_ID"])
		}
	}
	for k, id := range out.Jobs[:8] {
		if want := strings.TrimSpace(string(rune('0' + k))); byJob[id] != want {
			t.Fatalf("job %s got SPILLWAY_ARRAY_INDEX %q, want %s", id, byJob[id], want)
		}
	}
	h.clock.Step(10 * time.Minute)
	for _, id := range out.Jobs[:8] {
		a.exit(id, 0, "")
	}
	a.sync()
	h.cycle()
	resp = a.sync()
	if len(resp.Start) != 2 {
		t.Fatalf("%d starts after the first eight ended, want 2", len(resp.Start))
	}
	h.restart()
	a = h.agent("node-a", 8)
	for k, id := range out.Jobs {
		j := h.job(id)
		if j.ArrayIndex == nil || *j.ArrayIndex != k {
			t.Fatalf("after restart element %d: %+v", k, j)
		}
		if k < 8 {
			if j.State != broker.StateSucceeded {
				t.Fatalf("element %d: %s", k, j.State)
			}
			if got := states(j); !slices.Equal(got, []broker.State{broker.StatePending, broker.StateStarting, broker.StateRunning, broker.StateSucceeded}) {
				t.Fatalf("element %d history %v", k, got)
			}
			if gm, _ := h.ledgerFor(id); gm != 10*60*1000 {
				t.Fatalf("element %d ledger %d GPU-ms, want 600000", k, gm)
			}
		}
	}
}

// TestArrayBadInput: a malformed array names the field and the rule, and
// nothing is stored.
func TestArrayBadInput(t *testing.T) {
	h := newHarness(t)
	for _, arr := range []string{"9-1", "a-b", "0-20000", "1:2", "0-9:0", "-1", "0-1000001"} {
		var e struct {
			Error struct {
				Field   string `json:"field"`
				Message string `json:"message"`
			} `json:"error"`
		}
		spec := `{"resources":{"gpus":1},"timeout":"1h","command":["true"],"array":"` + arr + `"}`
		if code := h.do("POST", "/v1/jobs", tokAlice, spec, &e); code != http.StatusBadRequest {
			t.Fatalf("array %q: %d", arr, code)
		}
		if !strings.Contains(e.Error.Field+e.Error.Message, "array") {
			t.Fatalf("array %q: error %+v does not name the field", arr, e)
		}
	}
	var e map[string]any
	if code := h.do("POST", "/v1/jobs?array=0-3", tokAlice, `{"resources":{"gpus":1},"timeout":"1h","command":["true"],"array":"0-4"}`, &e); code != http.StatusBadRequest {
		t.Fatalf("two different arrays: %d", code)
	}
	var l api.JobList
	h.do("GET", "/v1/jobs", tokAdmin, nil, &l)
	if len(l.Jobs) != 0 {
		t.Fatalf("%d jobs stored after bad submits", len(l.Jobs))
	}
	var out api.ArraySubmitted
	if code := h.do("POST", "/v1/jobs?array=1,3,5-9:2", tokAlice, `{"resources":{"gpus":1},"timeout":"1h","command":["true"]}`, &out); code != http.StatusCreated {
		t.Fatalf("query array: %d", code)
	}
	if !slices.Equal(out.Indexes, []int{1, 3, 5, 7, 9}) {
		t.Fatalf("indexes %v", out.Indexes)
	}
}

// TestArrayCancel: cancelling an array's id cancels its waiting elements
// at once and stops its running ones, in index order, and nothing else:
// not another array submitted in the same millisecond, not a lone job.
// The elements are listed by arrayId, page by page; another team sees no
// such array; a second cancel while they stop changes nothing; once all
// have ended a cancel is a conflict.
func TestArrayCancel(t *testing.T) {
	h := newHarness(t)
	a := h.agent("node-a", 8)
	submitArray := func(array string) api.ArraySubmitted {
		t.Helper()
		var out api.ArraySubmitted
		spec := `{"name":"sweep","resources":{"gpus":1},"timeout":"1h","command":["python","eval.py"],"array":"` + array + `"}`
		if code := h.do("POST", "/v1/jobs", tokAlice, spec, &out); code != http.StatusCreated {
			t.Fatalf("submit array: %d", code)
		}
		return out
	}
	// The harness's clock stands still: all three share one millisecond.
	arr := submitArray("0-9")
	other := submitArray("0-1")
	lone := h.submit(tokAlice, `{"resources":{"gpus":1},"timeout":"1h","command":["true"]}`)
	h.cycle()
	a.sync() // elements 0-7 start

	var seen []string
	cursor := ""
	for range 5 {
		var page api.JobList
		if code := h.do("GET", "/v1/jobs?limit=4&arrayId="+arr.ArrayID+"&cursor="+cursor, tokAlice, nil, &page); code != http.StatusOK {
			t.Fatalf("list: %d", code)
		}
		for _, j := range page.Jobs {
			seen = append(seen, j.ID)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	slices.Reverse(seen) // newest first
	if !slices.Equal(seen, arr.Jobs) {
		t.Fatalf("listed %v, want %v", seen, arr.Jobs)
	}
	var bad struct {
		Error struct{ Field, Message string }
	}
	if code := h.do("GET", "/v1/jobs?arrayId=sweep", tokAlice, nil, &bad); code != http.StatusBadRequest || bad.Error.Field != "arrayId" {
		t.Fatalf("bad arrayId: %d %+v", code, bad)
	}

	for _, c := range []struct{ id, tok string }{{arr.ArrayID, tokBob}, {lone.ID, tokAlice}, {"not-an-id", tokAlice}} {
		if code := h.do("POST", "/v1/arrays/"+c.id+"/cancel", c.tok, nil, nil); code != http.StatusNotFound {
			t.Fatalf("cancel array %s as %s: %d, want 404", c.id, c.tok, code)
		}
	}
	var got api.ArrayCancelled
	if code := h.do("POST", "/v1/arrays/"+arr.ArrayID+"/cancel", tokAlice, nil, &got); code != http.StatusOK {
		t.Fatalf("cancel array: %d", code)
	}
	if got.ArrayID != arr.ArrayID || got.Count != 10 || got.Ended != 0 ||
		!slices.Equal(got.Stopping, arr.Jobs[:8]) || !slices.Equal(got.Cancelled, arr.Jobs[8:]) {
		t.Fatalf("answer %+v", got)
	}
	for k, id := range arr.Jobs {
		j := h.job(id)
		if k >= 8 && j.State != broker.StateCancelled || k < 8 && (j.Stop == nil || j.Stop.Reason != "cancelled") {
			t.Fatalf("element %d: %s, stop %+v", k, j.State, j.Stop)
		}
	}
	for _, id := range append(slices.Clone(other.Jobs), lone.ID) {
		if j := h.job(id); j.State != broker.StatePending || j.Stop != nil {
			t.Fatalf("job %s outside the array: %s, stop %+v", id, j.State, j.Stop)
		}
	}
	if code := h.do("POST", "/v1/arrays/"+arr.ArrayID+"/cancel", tokAlice, nil, &got); code != http.StatusOK ||
		len(got.Cancelled) != 0 || !slices.Equal(got.Stopping, arr.Jobs[:8]) || got.Ended != 2 {
		t.Fatalf("second cancel while stopping: %d %+v", code, got)
	}

	a.sync() // the stop orders
	for _, id := range arr.Jobs[:8] {
		a.exit(id, 143, "SIGTERM")
	}
	a.sync() // the ends
	for k, id := range arr.Jobs[:8] {
		if j := h.job(id); j.State != broker.StateCancelled {
			t.Fatalf("element %d after its stop: %s", k, j.State)
		}
	}
	if code := h.do("POST", "/v1/arrays/"+arr.ArrayID+"/cancel", tokAlice, nil, &bad); code != http.StatusConflict {
		t.Fatalf("cancel an ended array: %d %+v", code, bad)
	}
}

// TestArrayLimitRunsAtMostN: --array 0-5%2 on eight free cards starts two
// elements; the others wait with reason array_limit (and explain says
// so); when one ends, exactly one more starts. The limit survives a
// restart.
func TestArrayLimitRunsAtMostN(t *testing.T) {
	h := newHarness(t)
	a := h.agent("node-a", 8)
	var out api.ArraySubmitted
	spec := `{"name":"sweep","resources":{"gpus":1},"timeout":"1h","command":["python","eval.py"],"array":"0-5%2"}`
	if code := h.do("POST", "/v1/jobs", tokAlice, spec, &out); code != http.StatusCreated || out.Count != 6 {
		t.Fatalf("submit array: %d %+v", code, out)
	}
	h.cycle()
	if resp := a.sync(); len(resp.Start) != 2 || resp.Start[0].Job != out.Jobs[0] || resp.Start[1].Job != out.Jobs[1] {
		t.Fatalf("starts %+v, want elements 0 and 1", resp.Start)
	}
	j := h.job(out.Jobs[2])
	if j.ArrayLimit != 2 || j.Pending == nil || j.Pending.Code != sched.ReasonArrayLimit ||
		!strings.Contains(j.Pending.Message, "array "+out.ArrayID+" runs 2 elements at once, its limit (%2)") {
		t.Fatalf("element 2: limit %d, reason %+v", j.ArrayLimit, j.Pending)
	}
	wantVerdict(t, h.explain(tokAlice, out.Jobs[2]), report.VerdictArrayLimit, "array "+out.ArrayID, "at most 2")

	a.sync() // elements 0 and 1 run
	h.cycle()
	if resp := a.sync(); len(resp.Start) != 0 {
		t.Fatalf("%d more started while two run, want none", len(resp.Start))
	}
	a.exit(out.Jobs[0], 0, "")
	a.sync()
	h.cycle()
	if resp := a.sync(); len(resp.Start) != 1 || resp.Start[0].Job != out.Jobs[2] {
		t.Fatalf("after element 0 ended: starts %+v, want element 2 alone", resp.Start)
	}

	// After a restart the limit still holds (a new agent: the broker
	// requeues what ran on the old one, then starts two again).
	h.restart()
	a = h.agent("node-a", 8)
	for range 3 {
		a.sync()
		h.cycle()
	}
	if resp := a.sync(); len(a.started) != 2 || len(resp.Start) != 0 {
		t.Fatalf("after a restart %d started (%+v), want 2", len(a.started), resp.Start)
	}
}

// TestArrayHoldReleaseLimit: an array's id holds and releases its waiting
// elements in one call (running ones go on), its limit changes after
// submit (lowered, raised, lifted with 0), and GET /v1/arrays/ID sums it
// up: elements by state, the indexes still waiting and why. Each change
// is in every changed element's history and in the audit log; bad limits
// name the field; another team sees no such array.
func TestArrayHoldReleaseLimit(t *testing.T) {
	h := newHarness(t)
	a := h.agent("node-a", 8)
	var out api.ArraySubmitted
	spec := `{"name":"sweep","resources":{"gpus":1},"timeout":"1h","command":["python","eval.py"],"array":"0-5%2"}`
	if code := h.do("POST", "/v1/jobs", tokAlice, spec, &out); code != http.StatusCreated {
		t.Fatalf("submit array: %d", code)
	}
	arr := "/v1/arrays/" + out.ArrayID
	h.cycle()
	a.sync() // elements 0 and 1 start
	h.cycle()

	var v api.ArrayView
	if code := h.do("GET", arr, tokAlice, nil, &v); code != http.StatusOK {
		t.Fatalf("get array: %d", code)
	}
	if v.Count != 6 || v.Limit != 2 || v.Name != "sweep" || v.Team != "nlp" || v.GPUs != 1 || v.Indexes != "0-5" ||
		v.PendingIndexes != "2-5" || v.States[broker.StatePending] != 4 || v.Waiting[sched.ReasonArrayLimit] != 4 || v.Held != 0 {
		t.Fatalf("array view %+v", v)
	}
	for _, c := range []struct{ method, path, tok string }{
		{"GET", arr, tokBob}, {"POST", arr + "/hold", tokBob}, {"PUT", arr + "/limit", tokBob},
		{"GET", "/v1/arrays/" + out.Jobs[0], tokAlice}, {"POST", "/v1/arrays/not-an-array/hold", tokAlice},
	} {
		if code := h.do(c.method, c.path, c.tok, `{"limit":1}`, nil); code != http.StatusNotFound {
			t.Fatalf("%s %s as %s: %d, want 404", c.method, c.path, c.tok, code)
		}
	}

	var ch api.ArrayChanged
	if code := h.do("POST", arr+"/hold", tokAlice, `{"reason":"bad data in shards 2-5"}`, &ch); code != http.StatusOK ||
		!slices.Equal(ch.Changed, out.Jobs[2:]) || ch.Array.Held != 4 || ch.Array.Waiting["held"] != 4 {
		t.Fatalf("hold: %d %+v", code, ch)
	}
	j := h.job(out.Jobs[3])
	if j.Hold == nil || j.Hold.Reason != "bad data in shards 2-5" || j.Pending == nil || j.Pending.Code != "held" ||
		!strings.Contains(j.Pending.Message, "spillway job release "+out.ArrayID) {
		t.Fatalf("held element: hold %+v, reason %+v", j.Hold, j.Pending)
	}
	if code := h.do("POST", arr+"/hold", tokAlice, nil, &ch); code != http.StatusOK || len(ch.Changed) != 0 {
		t.Fatalf("hold again: %d %+v", code, ch)
	}
	a.exit(out.Jobs[0], 0, "")
	a.sync()
	h.cycle()
	if resp := a.sync(); len(resp.Start) != 0 {
		t.Fatalf("%d held elements started", len(resp.Start))
	}

	// A limit of 3, then release: one more starts (element 1 runs).
	if code := h.do("PUT", arr+"/limit", tokAlice, `{"limit":3,"reason":"more cards free"}`, &ch); code != http.StatusOK ||
		!slices.Equal(ch.Changed, out.Jobs[1:]) || ch.Array.Limit != 3 {
		t.Fatalf("limit 3: %d %+v", code, ch)
	}
	if j := h.job(out.Jobs[0]); j.ArrayLimit != 2 {
		t.Fatalf("the ended element's limit changed: %d", j.ArrayLimit)
	}
	if code := h.do("POST", arr+"/release", tokAlice, nil, &ch); code != http.StatusOK || !slices.Equal(ch.Changed, out.Jobs[2:]) || ch.Array.Held != 0 {
		t.Fatalf("release: %d %+v", code, ch)
	}
	h.cycle()
	if resp := a.sync(); len(resp.Start) != 2 || resp.Start[0].Job != out.Jobs[2] || resp.Start[1].Job != out.Jobs[3] {
		t.Fatalf("after release with limit 3: starts %+v, want elements 2 and 3", resp.Start)
	}
	h.cycle()
	if code := h.do("GET", arr, tokAlice, nil, &v); code != http.StatusOK || v.PendingIndexes != "4-5" ||
		v.Waiting[sched.ReasonArrayLimit] != 2 || v.States[broker.StateSucceeded] != 1 || v.Active() != 5 {
		t.Fatalf("array view after release: %d %+v", code, v)
	}

	// Lowered below what runs: the three go on, none more starts; lifted:
	// the rest start.
	if code := h.do("PUT", arr+"/limit", tokAlice, `{"limit":1}`, &ch); code != http.StatusOK || len(ch.Changed) != 5 {
		t.Fatalf("limit 1: %d %+v", code, ch)
	}
	h.cycle()
	if resp := a.sync(); len(resp.Start) != 0 || len(resp.Stop) != 0 {
		t.Fatalf("limit 1 with three running: starts %+v, stops %+v", resp.Start, resp.Stop)
	}
	if code := h.do("PUT", arr+"/limit", tokAlice, `{"limit":0}`, &ch); code != http.StatusOK || ch.Array.Limit != 0 {
		t.Fatalf("limit 0: %d %+v", code, ch)
	}
	h.cycle()
	if resp := a.sync(); len(resp.Start) != 2 {
		t.Fatalf("after the limit was lifted: %d starts, want 2", len(resp.Start))
	}
	var changes []string
	for _, tr := range h.job(out.Jobs[5]).History {
		if tr.From == broker.StatePending && tr.To == broker.StatePending {
			changes = append(changes, tr.Reason+": "+tr.Detail)
		}
	}
	if want := []string{"hold: held by alice (bad data in shards 2-5)", "limit: array limit %2 → %3 by alice (more cards free)",
		"release: released by alice", "limit: array limit %3 → %1 by alice", "limit: array limit %1 → none by alice"}; !slices.Equal(changes, want) {
		t.Fatalf("element 5's history:\n%s\nwant\n%s", strings.Join(changes, "\n"), strings.Join(want, "\n"))
	}

	if code := h.do("POST", arr+"/hold", tokAlice, nil, nil); code != http.StatusConflict {
		t.Fatalf("hold with nothing waiting: %d, want 409", code)
	}
	for body, field := range map[string]string{`{}`: "limit", `{"limit":-1}`: "limit", `{"limit":10001}`: "limit", `{"limit":"3"}`: "limit", `{"limit":3,"max":4}`: "max"} {
		var bad struct {
			Error struct{ Field, Message string }
		}
		if code := h.do("PUT", arr+"/limit", tokAlice, body, &bad); code != http.StatusBadRequest || bad.Error.Field != field {
			t.Fatalf("limit %s: %d %+v", body, code, bad)
		}
	}
	if code := h.do("POST", arr+"/cancel", tokAlice, nil, nil); code != http.StatusOK {
		t.Fatalf("cancel: %d", code)
	}
	a.sync()
	for _, id := range out.Jobs[1:] {
		a.exit(id, 143, "SIGTERM")
	}
	a.sync()
	if code := h.do("PUT", arr+"/limit", tokAlice, `{"limit":2}`, nil); code != http.StatusConflict {
		t.Fatalf("limit of an ended array: %d, want 409", code)
	}
	v = api.ArrayView{}
	if code := h.do("GET", arr, tokAlice, nil, &v); code != http.StatusOK || v.Active() != 0 || v.PendingIndexes != "" ||
		v.States[broker.StateCancelled] != 5 || v.Limit != 0 {
		t.Fatalf("the ended array: %d %+v", code, v)
	}
	assertAudit(t, h, "array.hold", "array.release", "array.limit")
}

func TestFormatIndexes(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{{nil, ""}, {[]int{4}, "4"}, {[]int{0, 1, 2, 3, 7, 9, 10}, "0-3,7,9-10"}, {[]int{0, 2, 4}, "0,2,4"}} {
		if got := broker.FormatIndexes(c.in); got != c.want {
			t.Errorf("FormatIndexes(%v) = %q, want %q", c.in, got, c.want)
		}
		if c.want != "" {
			if back, _, err := broker.ParseArray(c.want); err != nil || !slices.Equal(back, c.in) {
				t.Errorf("ParseArray(%q) = %v, %v", c.want, back, err)
			}
		}
	}
}

// TestListFoldsArrays: with foldArrays=true a listing shows an array's
// waiting elements as one (the newest stands for the rest, which do not
// take page slots), and JobList.Arrays sums them up; running elements and
// other jobs are listed as they are, and the next page starts after the
// folded ones.
func TestListFoldsArrays(t *testing.T) {
	h := newHarness(t)
	a := h.agent("node-a", 2)
	one := `{"resources":{"gpus":1},"timeout":"1h","command":["true"]}`
	var older, newer broker.Job
	if code := h.do("POST", "/v1/jobs", tokAlice, one, &older); code != http.StatusCreated {
		t.Fatalf("submit: %d", code)
	}
	var out api.ArraySubmitted
	if code := h.do("POST", "/v1/jobs?array=0-5", tokAlice, `{"name":"sweep","resources":{"gpus":1},"timeout":"1h","command":["true"]}`, &out); code != http.StatusCreated {
		t.Fatalf("submit array: %d", code)
	}
	h.cycle()
	a.sync() // the lone job and element 0 start
	if code := h.do("POST", "/v1/jobs", tokAlice, one, &newer); code != http.StatusCreated {
		t.Fatalf("submit: %d", code)
	}
	h.cycle()

	list := func(query string) api.JobList {
		t.Helper()
		var l api.JobList
		if code := h.do("GET", "/v1/jobs?"+query, tokAlice, nil, &l); code != http.StatusOK {
			t.Fatalf("GET /v1/jobs?%s: %d", query, code)
		}
		return l
	}
	ids := func(l api.JobList) []string {
		var ids []string
		for _, j := range l.Jobs {
			ids = append(ids, j.ID)
		}
		return ids
	}
	l := list("state=pending,starting,running&foldArrays=true")
	if want := []string{newer.ID, out.Jobs[5], out.Jobs[0], older.ID}; !slices.Equal(ids(l), want) || l.Next != "" {
		t.Fatalf("folded listing %v next %q, want %v", ids(l), l.Next, want)
	}
	v, ok := l.Arrays[out.ArrayID]
	waiting := 0
	for code, n := range v.Waiting {
		if code == "waiting" {
			t.Fatalf("folded elements without their reasons: %+v", v.Waiting)
		}
		waiting += n
	}
	if !ok || len(l.Arrays) != 1 || v.Count != 5 || v.PendingIndexes != "1-5" || v.States[broker.StatePending] != 5 ||
		waiting != 5 || v.Name != "sweep" || v.Team != "nlp" || v.GPUs != 1 {
		t.Fatalf("folded array %+v", l.Arrays)
	}
	p1 := list("state=pending,starting,running&foldArrays=true&limit=2")
	if want := []string{newer.ID, out.Jobs[5]}; !slices.Equal(ids(p1), want) || p1.Next != out.Jobs[1] || p1.Arrays[out.ArrayID].Count != 5 {
		t.Fatalf("page 1 %v next %q arrays %+v", ids(p1), p1.Next, p1.Arrays)
	}
	p2 := list("state=pending,starting,running&foldArrays=true&limit=2&cursor=" + p1.Next)
	if want := []string{out.Jobs[0], older.ID}; !slices.Equal(ids(p2), want) || p2.Next != "" || len(p2.Arrays) != 0 {
		t.Fatalf("page 2 %v next %q arrays %+v", ids(p2), p2.Next, p2.Arrays)
	}
	if l := list("state=pending,starting,running"); len(l.Jobs) != 8 || l.Arrays != nil {
		t.Fatalf("unfolded listing: %d jobs, arrays %+v", len(l.Jobs), l.Arrays)
	}
	if l := list("arrayId=" + out.ArrayID + "&state=pending&foldArrays=true&limit=1"); !slices.Equal(ids(l), []string{out.Jobs[5]}) || l.Arrays[out.ArrayID].PendingIndexes != "1-5" {
		t.Fatalf("one array folded: %v %+v", ids(l), l.Arrays)
	}
	var e struct {
		Error struct {
			Field string `json:"field"`
		} `json:"error"`
	}
	if code := h.do("GET", "/v1/jobs?foldArrays=yes", tokAlice, nil, &e); code != http.StatusBadRequest || e.Error.Field != "foldArrays" {
		t.Fatalf("foldArrays=yes: %d %+v", code, e)
	}
}
