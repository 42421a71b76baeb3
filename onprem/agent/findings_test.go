package agent

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/gpu/sim"
)

// TestFinding8DoubleRunAfterAgentKill: a job's process does not outlive
// an agent killed with SIGKILL (the broker retries the job elsewhere, so
// the old copy would run beside the retry).
func TestFinding8DoubleRunAfterAgentKill(t *testing.T) {
	if os.Getenv("SPILLWAY_TEST_AGENT_CHILD") != "" {
		return // the child's part runs in TestMain-less mode below
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAgentChildStartsJob$")
	cmd.Env = append(os.Environ(), "SPILLWAY_TEST_AGENT_CHILD="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	pid := 0
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "JOBPID "); ok {
			pid, _ = strconv.Atoi(p)
			break
		}
	}
	if pid == 0 {
		_ = cmd.Process.Kill()
		t.Fatal("the child agent did not start a job")
	}
	go io.Copy(io.Discard, out)
	if !alive(pid) {
		t.Fatalf("job %d not running", pid)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL) // the agent dies hard
	_ = cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for alive(pid) && !zombie(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("job process %d still runs 20s after its agent was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentChildStartsJob is the child of TestFinding8DoubleRunAfterAgentKill:
// an agent that starts one job and waits to be killed. Run on its own it
// does nothing (a return, not a skip: under CI=true any skip fails the run).
func TestAgentChildStartsJob(t *testing.T) {
	dir := os.Getenv("SPILLWAY_TEST_AGENT_CHILD")
	if dir == "" {
		return
	}
	be, _ := sim.New("1xH100-80GB", "n", sim.Options{})
	ag, err := New(Config{Broker: "http://127.0.0.1:1", Token: "t", Name: "n", DataDir: dir}, be, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r := ag.startRun(agentapi.Assignment{JobRef: agentapi.JobRef{Job: "J1", Attempt: 1}, Argv: []string{"sleep", "300"}})
	if r.pgid == 0 {
		t.Fatalf("job did not start: %s", r.message)
	}
	os.Stdout.WriteString("JOBPID " + strconv.Itoa(r.pgid) + "\n")
	// Kept: the child agent lives until its parent kills it; the minute
	// only ends it should the parent die first. Nothing is ordered by it.
	time.Sleep(time.Minute)
}

func zombie(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(raw))
	return len(f) > 2 && f[2] == "Z"
}
