//go:build unix

package sched

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) this process has used: the
// benchmarks report it next to wall time because wall time on a shared
// machine counts other people's work too.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
