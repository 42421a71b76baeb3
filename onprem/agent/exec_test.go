package agent

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// execSleep starts a sleeping process in its own group carrying a job id.
func execSleep(t *testing.T, job string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	cmd.Env = []string{"SPILLWAY_JOB_ID=" + job}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	return cmd
}

func waitExit(cmd *exec.Cmd, within time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return nil
	case <-time.After(within):
		return errors.New("still running")
	}
}

// sharedDir is a temporary directory every uid may write: jobs run as an
// unprivileged uid when the tests run as root, and t.TempDir is private.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "spillway-shared-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
