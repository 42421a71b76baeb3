package backends

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/onprem/gpu/sim"
)

func open(t *testing.T, spec string) gpu.Backend {
	t.Helper()
	b, err := Open(spec, "node-1", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Open(%q): %v", spec, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestOpenSpecs(t *testing.T) {
	tests := []struct {
		spec    string
		backend string
		cards   int
		model   string
	}{
		{"none", "none", 0, ""},
		{"sim:8xH100-80GB", "sim", 8, "NVIDIA H100 80GB HBM3"},
		{" sim:4xA100-40GB ", "sim", 4, "NVIDIA A100-SXM4-40GB"},
		{"sim:2xL4-24GB,control=" + t.TempDir(), "sim", 2, "NVIDIA L4"},
		{"mock:dgxh100", "mock", 8, "NVIDIA H100 80GB HBM3"},
	}
	for _, tt := range tests {
		inv, err := open(t, tt.spec).Inventory()
		if err != nil {
			t.Fatal(err)
		}
		if inv.Backend != tt.backend || len(inv.Devices) != tt.cards {
			t.Errorf("%s: %s backend with %d cards, want %s with %d", tt.spec, inv.Backend, len(inv.Devices), tt.backend, tt.cards)
		}
		if tt.cards > 0 && inv.Devices[0].Model != tt.model {
			t.Errorf("%s: model %q, want %q", tt.spec, inv.Devices[0].Model, tt.model)
		}
	}
}

func TestOpenRejectsBadSpecs(t *testing.T) {
	for _, spec := range []string{"gpu", "nvml:0", "none:x", "auto:x", "sim:", "sim:8xH100", "sim:8xH100-80GB,foo=bar",
		"sim:8xH100-80GB,control=", "mock:", "mock:dgxa100", "sim:0xH100-80GB", "sim:10000xH100-80GB", "SIM:1xL4-24GB"} {
		_, err := Open(spec, "n", slog.New(slog.DiscardHandler))
		if !errors.Is(err, ErrBadSpec) {
			t.Errorf("Open(%q) = %v, want ErrBadSpec", spec, err)
		}
	}
}

// TestNVMLWithoutDriver covers both kinds of machine: without a driver,
// nvml fails saying so and auto falls back to none with a log line; with
// one, both open NVML.
func TestNVMLWithoutDriver(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	nb, nerr := Open("nvml", "n", log)
	ab, aerr := Open("auto", "n", log)
	if aerr != nil {
		t.Fatalf("auto must not fail: %v", aerr)
	}
	defer ab.Close()
	inv, _ := ab.Inventory()
	if nerr == nil {
		defer nb.Close()
		if inv.Backend != "nvml" {
			t.Errorf("NVML works here, yet auto chose %s", inv.Backend)
		}
		return
	}
	if !errors.Is(nerr, gpu.ErrUnavailable) || !strings.Contains(nerr.Error(), "libnvidia-ml.so.1") {
		t.Errorf("nvml without a driver: %v; want ErrUnavailable naming libnvidia-ml.so.1", nerr)
	}
	if inv.Backend != "none" || len(inv.Devices) != 0 {
		t.Errorf("auto without a driver: %s with %d cards, want none", inv.Backend, len(inv.Devices))
	}
	if !strings.Contains(logs.String(), "no usable NVIDIA GPUs; this node runs without GPUs") {
		t.Errorf("auto fell back silently; logs:\n%s", logs.String())
	}
}

func TestSimControlDirFromSpec(t *testing.T) {
	dir := t.TempDir()
	b := open(t, "sim:2xL4-24GB,control="+dir)
	if err := os.WriteFile(filepath.Join(dir, "xid-1"), []byte("48"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if ev := s.Devices[1].Events; len(ev) != 1 || ev[0].Code != 48 || !gpu.Critical(ev[0]) {
		t.Errorf("card 1 events = %v, want one critical XID 48", ev)
	}
	// The spec's backend is the sim package's, with its test hooks.
	if _, ok := b.(*sim.Backend); !ok {
		t.Errorf("sim spec opened a %T", b)
	}
}

func TestProbe(t *testing.T) {
	for _, spec := range []string{"sim:4xL4-24GB", "mock:dgxh100", "none"} {
		b := open(t, spec)
		out, err := Probe(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(out, []byte("}\n")) || !bytes.Contains(out, []byte("\n  \"inventory\": {")) {
			t.Errorf("%s: probe is not indented JSON ending in a newline:\n%s", spec, out)
		}
		var got ProbeResult
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: probe output does not decode: %v", spec, err)
		}
		inv, _ := b.Inventory()
		if diff := cmp.Diff(inv, got.Inventory); diff != "" {
			t.Errorf("%s: probed inventory (-want +got):\n%s", spec, diff)
		}
		if len(got.Sample.Devices) != len(inv.Devices) || got.Sample.At.IsZero() {
			t.Errorf("%s: probed sample has %d cards at %v", spec, len(got.Sample.Devices), got.Sample.At)
		}
	}
}

func TestProbeReportsErrors(t *testing.T) {
	b := open(t, "sim:1xT4-16GB")
	b.Close()
	if _, err := Probe(b); !errors.Is(err, gpu.ErrUnavailable) {
		t.Errorf("Probe of a closed backend = %v, want ErrUnavailable", err)
	}
}
