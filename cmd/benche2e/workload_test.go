package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLowerBound(t *testing.T) {
	items := []Item{
		{ID: "a", SubmitS: 0, GPUs: 8, DurationS: 10},
		{ID: "b", SubmitS: 0, GPUs: 8, DurationS: 10},
		{ID: "c", SubmitS: 30, GPUs: 1, DurationS: 1},
	}
	// 160 GPU-s over 8 cards from t=0 is 20 s; c alone ends at 31 s.
	if got := lowerBound(items, 8); got != 31 {
		t.Fatalf("lower bound %v, want 31", got)
	}
	if got := lowerBound(items[:2], 16); got != 10 {
		t.Fatalf("lower bound %v, want 10 (each job's own duration)", got)
	}
}

func TestReadWorkloadRejectsBadLines(t *testing.T) {
	dir := t.TempDir()
	for line, want := range map[string]string{
		`{"id":"a","submit_s":0,"gpus":0,"duration_s":1,"team":"x"}`:                     "gpus",
		`{"id":"a","submit_s":-1,"gpus":1,"duration_s":1,"team":"x"}`:                    "submit_s",
		`{"id":"a","submit_s":0,"gpus":1,"duration_s":1,"team":"x","priority":"urgent"}`: "priority",
		`{"id":"a","submit_s":0,"gpus":1,"duration_s":1}`:                                "team",
		`{"id":"a","submit_s":0,"gpus":1,"duration_s":1,"team":"x","extra":`:             "unexpected",
	} {
		p := filepath.Join(dir, "w.jsonl")
		if err := os.WriteFile(p, []byte(line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readWorkload(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: error %v, want one about %s", line, err, want)
		}
	}
}

// TestGeneratedWorkloads: the committed workload files are what -gen
// writes, and the mixed one has the documented shape.
func TestGeneratedWorkloads(t *testing.T) {
	for kind, file := range map[string]string{"zero": "zero-2000.jsonl", "mixed": "mixed-500.jsonl"} {
		var buf bytes.Buffer
		if err := generate(kind, &buf); err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join("..", "..", "deploy", "bench", file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), committed) {
			t.Fatalf("deploy/bench/%s differs from benche2e -gen %s", file, kind)
		}
	}
	items, err := readWorkload(filepath.Join("..", "..", "deploy", "bench", "mixed-500.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 500 || math.Abs(lowerBound(items, 32)-107.47) > 0.01 {
		t.Fatalf("%d jobs, lower bound %.2f", len(items), lowerBound(items, 32))
	}
	zero, err := readWorkload(filepath.Join("..", "..", "deploy", "bench", "zero-2000.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if g := arrayGroups(zero); len(g) != 1 || len(g[0]) != 2000 {
		t.Fatalf("the zero workload is not one array: %d groups", len(g))
	}
}
