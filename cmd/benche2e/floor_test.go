package main

import (
	"errors"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
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

// TestPidsCPUCountsReapedChildren: a process's own CPU and, apart, the CPU
// of the children it waited for, as the replay reports them for agents.
func TestPidsCPUCountsReapedChildren(t *testing.T) {
	// The shell spins, runs a child that spins, then waits on its stdin
	// until the test has read its figures.
	loop := `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done`
	sh := exec.Command("sh", "-c", loop+"; sh -c '"+loop+"'; read x || true")
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	pid := sh.Process.Pid
	deadline := time.Now().Add(time.Minute)
	var own, reaped float64
	for reaped == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no reaped CPU after a minute (own %.2f s)", own)
		}
		time.Sleep(5 * time.Millisecond)
		own, reaped = pidsCPU([]int{pid})
	}
	stdin.Close()
	if err := sh.Wait(); err != nil {
		t.Fatal(err)
	}
	if own <= 0 {
		t.Fatalf("own %.2f s, want > 0", own)
	}
	if o, r := pidsCPU([]int{pid}); o != 0 || r != 0 {
		t.Fatalf("a process that is gone counts %.2f / %.2f s, want nothing", o, r)
	}
}
