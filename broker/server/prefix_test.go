package server

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

// TestJobIDPrefix: a unique prefix names a job as the full id does (as
// git resolves short hashes), in any case; an ambiguous one is a 409 that
// names the candidates; another team's jobs neither match nor show.
func TestJobIDPrefix(t *testing.T) {
	h := newHarness(t)
	a := h.submit(tokAlice, oneGPU)
	b := h.submit(tokAlice, oneGPU)
	common := 0
	for common < len(a.ID) && a.ID[common] == b.ID[common] {
		common++
	}
	unique := a.ID[:common+1]
	var got broker.Job
	if code := h.do("GET", "/v1/jobs/"+strings.ToLower(unique), tokAlice, nil, &got); code != http.StatusOK || got.ID != a.ID {
		t.Fatalf("GET prefix %s = %d %s, want %s", unique, code, got.ID, a.ID)
	}
	if common >= MinIDPrefix {
		var e struct {
			Error struct{ Code, Message string }
		}
		code := h.do("GET", "/v1/jobs/"+a.ID[:common], tokAlice, nil, &e)
		if code != http.StatusConflict || !strings.Contains(e.Error.Message, a.ID) || !strings.Contains(e.Error.Message, b.ID) {
			t.Fatalf("ambiguous prefix: %d %+v", code, e)
		}
	}
	if code := h.do("POST", "/v1/jobs/"+unique+"/cancel", tokAlice, nil, &got); code != http.StatusOK || got.ID != a.ID {
		t.Fatalf("cancel by prefix = %d %s", code, got.ID)
	}
	if code := h.do("GET", "/v1/jobs/"+unique, tokBob, nil, nil); code != http.StatusNotFound {
		t.Fatalf("bob resolves alice's prefix: %d", code)
	}
	if code := h.do("GET", "/v1/jobs/"+a.ID[:MinIDPrefix-1], tokAlice, nil, nil); code != http.StatusNotFound {
		t.Fatalf("a prefix shorter than %d resolved: %d", MinIDPrefix, code)
	}
}

// TestUnsatisfiableModel: a gpuModel no node has (and no offer, with no
// provider configured) is refused at submit with the models there are,
// instead of waiting forever; one a node has is accepted.
func TestUnsatisfiableModel(t *testing.T) {
	h := newHarness(t)
	h.agent("n1", 8)
	var e struct {
		Error struct{ Code, Message, Field string }
	}
	code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1, "gpuModel": "B200"}, "timeout": "1h", "command": ["true"]}`, &e)
	if code != http.StatusBadRequest || e.Error.Code != CodeUnsatisfiable || e.Error.Field != "resources.gpuModel" ||
		!strings.Contains(e.Error.Message, "B200") || !strings.Contains(e.Error.Message, "H100") {
		t.Fatalf("B200: %d %+v", code, e)
	}
	if j := h.submit(tokAlice, `{"resources": {"gpus": 1, "gpuModel": "h100"}, "timeout": "1h", "command": ["true"]}`); j.ID == "" {
		t.Fatal("h100 refused")
	}
}

// TestUnsatisfiableModelWithOffers: a model only a cloud offer has is
// accepted (it may burst), refused when the job may not burst, and a
// model neither a node nor an offer has is refused naming both.
func TestUnsatisfiableModelWithOffers(t *testing.T) {
	r := newBurstRig(t, append(slices.Clone(testOffers), providers.Offer{Region: "r1", InstanceType: "b200-8", GPUModel: "B200", GPUs: 8,
		GPUMemoryBytes: 180 << 30, PricePerHour: price("90.00"), Currency: "USD", Available: true})...)
	r.step() // the offers are read
	if j := r.submit(tokAlice, `{"resources": {"gpus": 1, "gpuModel": "B200"}, "timeout": "1h", "command": ["true"]}`); j.ID == "" {
		t.Fatal("B200, which an offer has, refused")
	}
	var e struct {
		Error struct{ Code, Message, Field string }
	}
	code := r.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1, "gpuModel": "B200"}, "burst": "never", "timeout": "1h", "command": ["true"]}`, &e)
	if code != http.StatusBadRequest || e.Error.Code != CodeUnsatisfiable || !strings.HasPrefix(e.Error.Message, "no node has gpuModel B200") {
		t.Fatalf("B200 with burst never: %d %+v", code, e)
	}
	code = r.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1, "gpuModel": "MI300X"}, "timeout": "1h", "command": ["true"]}`, &e)
	if code != http.StatusBadRequest || e.Error.Field != "resources.gpuModel" ||
		!strings.HasPrefix(e.Error.Message, "no node and no cloud offer has gpuModel MI300X") || !strings.Contains(e.Error.Message, "B200, H100") {
		t.Fatalf("MI300X: %d %+v", code, e)
	}
}

// TestInstanceIDPrefix: a burst machine is named by a unique prefix of its
// record id, with or without "spw-", in any case; a prefix two machines
// share is a 409 naming both.
func TestInstanceIDPrefix(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("two machines", 600, func() bool { return len(r.records()) >= 2 })
	recs := r.records()
	a, b := recs[0].ID, recs[1].ID
	common := 0
	for common < len(a) && a[common] == b[common] {
		common++
	}
	for _, p := range []string{a[:common+1], strings.TrimPrefix(a[:common+1], "spw-"), strings.ToUpper(strings.TrimPrefix(a[:common+1], "spw-"))} {
		var got struct{ ID string }
		if code := r.do("GET", "/v1/instances/"+p, tokAdmin, nil, &got); code != http.StatusOK || got.ID != a {
			t.Errorf("GET /v1/instances/%s = %d %q, want %s", p, code, got.ID, a)
		}
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if code := r.do("GET", "/v1/instances/"+a[:common], tokAdmin, nil, &e); code != http.StatusConflict ||
		!strings.Contains(e.Error.Message, a) || !strings.Contains(e.Error.Message, b) {
		t.Fatalf("ambiguous prefix %s: %d %+v", a[:common], code, e)
	}
}
