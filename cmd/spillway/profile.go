package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"runtime/trace"
)

// startProfiles writes a CPU profile and a runtime trace of this process
// to the given files (either may be ""), for the agent's
// SPILLWAY_CPUPROFILE and SPILLWAY_TRACE (docs/benchmarks.md). The
// returned func stops both and closes the files.
func startProfiles(cpuFile, traceFile string) (func(), error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if cpuFile != "" {
		f, err := os.Create(cpuFile)
		if err != nil {
			return stop, fmt.Errorf("SPILLWAY_CPUPROFILE: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return stop, fmt.Errorf("SPILLWAY_CPUPROFILE: %w", err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if traceFile != "" {
		f, err := os.Create(traceFile)
		if err != nil {
			stop()
			return func() {}, fmt.Errorf("SPILLWAY_TRACE: %w", err)
		}
		if err := trace.Start(f); err != nil {
			f.Close()
			stop()
			return func() {}, fmt.Errorf("SPILLWAY_TRACE: %w", err)
		}
		stops = append(stops, func() { trace.Stop(); f.Close() })
	}
	return stop, nil
}
