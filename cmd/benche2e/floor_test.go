package main

import (
	"io"
	"strings"
	"testing"
)

func TestSpawnFloorStartsAndReapsEveryProcess(t *testing.T) {
	rate, err := spawnFloor(40, 4)
	if err != nil {
		t.Fatal(err)
	}
	if rate <= 0 {
		t.Fatalf("rate %v, want > 0", rate)
	}
}

func TestFloorFlagRejectsANegativeCount(t *testing.T) {
	err := run([]string{"-workload", "x.jsonl", "-floor", "-1"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-floor must be ≥ 0") {
		t.Fatalf("err %v, want one naming -floor", err)
	}
}
