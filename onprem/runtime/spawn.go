package runtime

import (
	"os/exec"
	goruntime "runtime"
	"sync"
)

// Jobs start with Pdeathsig (process.go), which Linux ties to the thread that
// forked them, not the process: a job forked from a thread the Go runtime
// later retires would get SIGKILL at once. So every job is forked from
// one goroutine locked to its thread for the agent's whole life.
var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startCmd starts cmd from the spawner thread.
func startCmd(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			goruntime.LockOSThread() // never unlocked: the thread lives as long as the agent
			for r := range spawnCh {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawnCh <- spawnReq{cmd: cmd, done: done}
	return <-done
}
