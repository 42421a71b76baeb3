package main

import (
	"strings"
	"testing"
	"time"
)

func TestReplaceKeepsTheProse(t *testing.T) {
	doc := "# Benchmarks\n\n## Sched\n\nprose before\n<!-- bench:sched -->\nold figures\n<!-- /bench:sched -->\nprose after\n"
	b := block("go test -bench .", time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC), "a CPU × 2", []byte("BenchmarkX 30 1 ns/op\n\n"))
	got, err := replace([]byte(doc), "sched", "", b)
	if err != nil {
		t.Fatal(err)
	}
	want := "# Benchmarks\n\n## Sched\n\nprose before\n<!-- bench:sched -->\n" +
		"Latest `make bench` run: 2026-12-01 09:30 UTC, a CPU × 2.\n\n```\n$ go test -bench .\nBenchmarkX 30 1 ns/op\n```\n" +
		"<!-- /bench:sched -->\nprose after\n"
	if string(got) != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	again, err := replace(got, "sched", "", b)
	if err != nil || string(again) != want {
		t.Fatalf("a second run is not idempotent:\n%s", again)
	}
}

func TestReplaceAppendsANewSection(t *testing.T) {
	got, err := replace([]byte("# Benchmarks\n\ntext\n\n"), "sim", "Simulator", []byte("figures\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Benchmarks\n\ntext\n\n## Simulator\n\n<!-- bench:sim -->\nfigures\n<!-- /bench:sim -->\n"; string(got) != want {
		t.Fatalf("got %q", got)
	}
	if _, err := replace([]byte("no markers"), "sim", "", nil); err == nil || !strings.Contains(err.Error(), "bench:sim") {
		t.Fatalf("missing markers without a title: %v", err)
	}
	if _, err := replace([]byte("<!-- /bench:x --> <!-- bench:x -->"), "x", "", nil); err == nil {
		t.Fatal("markers out of order accepted")
	}
}
