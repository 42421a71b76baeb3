package main

import (
	"bytes"
	"context"
	"runtime/trace"
	"strings"
	"testing"
	"time"
)

// TestReadRegions: the regions of a trace written here come back by
// type, with their counts, and the long list holds exactly the
// occurrences at or over the threshold.
func TestReadRegions(t *testing.T) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skipf("a trace is already running: %v", err)
	}
	ctx := context.Background()
	for range 3 {
		trace.WithRegion(ctx, "agent.spawn", func() {})
	}
	done := make(chan struct{})
	go func() { // another goroutine's region, nested
		defer close(done)
		r := trace.StartRegion(ctx, "broker.cycle")
		trace.WithRegion(ctx, "broker.schedule", func() {})
		r.End()
	}()
	<-done
	trace.Stop()

	st, err := readRegions(bytes.NewReader(buf.Bytes()), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"agent.spawn": 3, "broker.cycle": 1, "broker.schedule": 1}
	if len(st.lens) != len(want) {
		t.Fatalf("region types %v, want %v", st.lens, want)
	}
	for name, n := range want {
		if got := len(st.lens[name]); got != n {
			t.Errorf("%s: %d occurrences, want %d", name, got, n)
		}
	}
	if len(st.long) != 0 {
		t.Errorf("long list without a threshold: %+v", st.long)
	}
	st, err = readRegions(bytes.NewReader(buf.Bytes()), time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.long) != 5 {
		t.Errorf("long list at 1ns holds %d, want all 5", len(st.long))
	}
	var out strings.Builder
	st.print(&out, "t.trace", time.Nanosecond)
	if !strings.Contains(out.String(), "agent.spawn") || !strings.Contains(out.String(), "n      3") {
		t.Errorf("summary:\n%s", out.String())
	}
}
