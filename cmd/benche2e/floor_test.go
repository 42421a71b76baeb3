package main

import (
	"errors"
	"io"
	"strings"
	"syscall"
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
	// Nothing is left to reap: every process it started was waited for.
	if pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); !errors.Is(err, syscall.ECHILD) {
		t.Fatalf("after the floor: wait4 gave pid %d, err %v; want ECHILD (no children left)", pid, err)
	}
}

func TestFloorFlagRejectsANegativeCount(t *testing.T) {
	err := run([]string{"-workload", "x.jsonl", "-floor", "-1"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-floor must be ≥ 0") {
		t.Fatalf("err %v, want one naming -floor", err)
	}
}
