package main

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// spawnFloor measures what this machine allows a replay of zero-length
// jobs at best: n processes of the command such a job runs (`true`),
// started and reaped by this process alone, at most par at a time, in a
// new process group each, as an agent starts a job. No broker, no agent,
// no HTTP: the rate it returns is a ceiling for "jobs started/s" on the
// same machine, and where a replay's rate is close to it, process creation
// and not the broker bounds the replay.
func spawnFloor(n, par int) (rate float64, err error) {
	bin, err := exec.LookPath("true")
	if err != nil {
		return 0, fmt.Errorf("spawn floor: %w", err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("spawn floor: %w", err)
	}
	defer null.Close()
	next := make(chan struct{})
	errs := make(chan error, par)
	var wg sync.WaitGroup
	start := time.Now()
	for range par {
		wg.Go(func() {
			for range next {
				cmd := exec.Command(bin)
				cmd.Stdout, cmd.Stderr = null, null
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
				if err := cmd.Run(); err != nil {
					errs <- fmt.Errorf("spawn floor: %s: %w", bin, err)
					for range next {
					}
					return
				}
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return float64(n) / elapsed.Seconds(), nil
}
