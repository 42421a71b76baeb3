// Package backends opens a gpu.Backend from the spec string an operator
// writes in the agent's flags or config:
//
//	auto                         NVML when it starts, else no GPUs (logged)
//	nvml                         NVML, or an error saying why it cannot start
//	none                         no GPUs
//	sim:8xH100-80GB              simulated cards (see package sim)
//	sim:2xL4-24GB,control=DIR    ... with a control directory for test triggers
//	sim:2xL4-24GB,seed=S         ... with UUIDs of their own (clusters side by side)
//	mock:dgxh100                 go-nvml's DGX H100 mock through the NVML adapter
//
// and prints what a backend sees (Probe), for `spillway agent --probe`.
package backends

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/onprem/gpu/nvml"
	"github.com/spillway-dev/spillway/onprem/gpu/sim"
)

// SpecHelp lists the accepted specs, for flag help and error messages.
const SpecHelp = "auto | nvml | none | sim:<count>x<model>-<memory>GB[,control=<dir>][,seed=<s>] | mock:dgxh100"

// ErrBadSpec is returned for a spec string that names no backend.
var ErrBadSpec = errors.New("bad GPU backend spec")

// Identity is what seeds a node's simulated and mock card UUIDs: its name
// and its agent's data dir. Two agents of one name on one host (two
// `spillway dev` brokers, say) then never share a card UUID: simulated
// cards find their processes by CUDA_VISIBLE_DEVICES, and an agent kills
// processes on its cards that belong to no job of its own. The same agent
// keeps its UUIDs across restarts.
func Identity(node, dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return node + "@" + hex.EncodeToString(sum[:4])
}

// Open starts the backend a spec names. identity (Identity) seeds the
// simulated and mock UUIDs, so each node's cards are its own. An empty
// spec means auto.
func Open(spec, identity string, log *slog.Logger) (gpu.Backend, error) {
	if log == nil {
		log = slog.Default()
	}
	kind, arg, _ := strings.Cut(strings.TrimSpace(spec), ":")
	switch kind {
	case "", "auto":
		if arg != "" {
			break
		}
		b, err := nvml.Open(nvml.Options{Log: log})
		if err != nil {
			log.Info("no usable NVIDIA GPUs; this node runs without GPUs", "backend", "auto", "reason", err)
			return None(), nil
		}
		inv, _ := b.Inventory()
		log.Info("GPUs found through NVML", "backend", "auto", "gpus", len(inv.Devices), "driver", inv.DriverVersion)
		return b, nil
	case "nvml":
		if arg != "" {
			break
		}
		b, err := nvml.Open(nvml.Options{Log: log})
		if err != nil {
			return nil, fmt.Errorf("open GPU backend nvml: %w", err)
		}
		return b, nil
	case "none":
		if arg != "" {
			break
		}
		return None(), nil
	case "sim":
		return openSim(arg, identity, log)
	case "mock":
		if arg != "dgxh100" {
			return nil, fmt.Errorf("GPU backend %q: the only mock is mock:dgxh100: %w", spec, ErrBadSpec)
		}
		b, err := nvml.New(nvml.NewDGXH100Mock(identity), nvml.Options{Name: "mock", Log: log})
		if err != nil {
			return nil, fmt.Errorf("open GPU backend mock:dgxh100: %w", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("GPU backend %q: want %s: %w", spec, SpecHelp, ErrBadSpec)
}

// openSim reads "8xH100-80GB[,control=DIR][,seed=S]". The seed joins the
// identity in making the cards' UUIDs.
func openSim(arg, identity string, log *slog.Logger) (gpu.Backend, error) {
	fleet, rest, _ := strings.Cut(arg, ",")
	opts := sim.Options{Log: log}
	seeded := identity
	if rest != "" {
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			switch {
			case ok && k == "control" && v != "":
				opts.ControlDir = v
			case ok && k == "seed" && v != "":
				seeded = identity + "/" + v
			default:
				return nil, fmt.Errorf("GPU backend sim:%s: unknown option %q (want control=<dir> or seed=<s>): %w", arg, kv, ErrBadSpec)
			}
		}
	}
	b, err := sim.New(fleet, seeded, opts)
	if err != nil {
		return nil, fmt.Errorf("open GPU backend sim: %w: %w", ErrBadSpec, err)
	}
	return b, nil
}

// None returns a backend with no GPUs, for CPU-only nodes.
func None() gpu.Backend { return noneBackend{} }

// noneBackend is a node without GPUs.
type noneBackend struct{}

// Inventory lists no cards.
func (noneBackend) Inventory() (gpu.Inventory, error) {
	return gpu.Inventory{Backend: "none", Devices: []gpu.Device{}}, nil
}

// Sample reads no cards.
func (noneBackend) Sample() (gpu.Sample, error) {
	return gpu.Sample{At: time.Now(), Devices: []gpu.DeviceSample{}}, nil
}

// Close has nothing to release.
func (noneBackend) Close() error { return nil }

// ProbeResult is what Probe prints.
type ProbeResult struct {
	Inventory gpu.Inventory `json:"inventory"`
	Sample    gpu.Sample    `json:"sample"`
}

// Probe reads the inventory and one telemetry sample and returns them as
// indented JSON ending in a newline.
func Probe(b gpu.Backend) ([]byte, error) {
	inv, err := b.Inventory()
	if err != nil {
		return nil, fmt.Errorf("probe inventory: %w", err)
	}
	s, err := b.Sample()
	if err != nil {
		return nil, fmt.Errorf("probe sample: %w", err)
	}
	out, err := json.MarshalIndent(ProbeResult{Inventory: inv, Sample: s}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode probe: %w", err)
	}
	return append(out, '\n'), nil
}
