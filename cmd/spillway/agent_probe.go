package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/spillway-dev/spillway/onprem/agent"
	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/onprem/runtime"
)

// withRuntimeProbe adds what the node's runtime can enforce to the GPU
// probe's JSON, under "runtime".
func withRuntimeProbe(gpuJSON []byte, c agent.Config, backend gpu.Backend) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(gpuJSON, &doc); err != nil {
		return nil, fmt.Errorf("read gpu probe: %w", err)
	}
	inv, _ := backend.Inventory()
	doc["runtime"] = runtime.ProbeNode(c.Runtime, runtime.Options{DataDir: c.DataDir, SimulatedGPUs: inv.Backend != "nvml"})
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
