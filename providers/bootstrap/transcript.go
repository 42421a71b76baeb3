package bootstrap

import "time"

// Init says how the agent is kept running on a machine.
const (
	InitSystemd    = "systemd"    // a systemd unit, Restart=always
	InitSupervised = "supervised" // a setsid'd shell loop with a pid file
)

// Transcript is the record of one bootstrap, JSON-serialisable for the
// broker's instance record (`spillway instances describe` prints it).
// It never contains the agent token: the config travels on stdin.
type Transcript struct {
	Addr string `json:"addr"`
	User string `json:"user"`
	// HostKey is the SHA256 fingerprint of the host key accepted.
	HostKey string `json:"hostKey,omitempty"`
	// Platform is the machine's "os/arch".
	Platform string `json:"platform,omitempty"`
	// Init is InitSystemd or InitSupervised.
	Init string `json:"init,omitempty"`
	// Binary is the local path uploaded, BinarySHA256 its checksum.
	Binary       string    `json:"binary,omitempty"`
	BinarySHA256 string    `json:"binarySha256,omitempty"`
	StartedAt    time.Time `json:"startedAt"`
	Steps        []Step    `json:"steps"`
	Phases       Phases    `json:"phases"`
	// Error is why the bootstrap failed; empty on success.
	Error string `json:"error,omitempty"`
}

// Phases splits the time from the first connect attempt to "agent
// registered". Durations are JSON numbers of nanoseconds.
type Phases struct {
	// Connect includes waiting for the machine to boot and publish keys.
	Connect time.Duration `json:"connect"`
	// Upload covers the probe, the binary and the config.
	Upload   time.Duration `json:"upload"`
	Start    time.Duration `json:"start"`
	Register time.Duration `json:"register"`
	Total    time.Duration `json:"total"`
}

// Step is one thing done to the machine.
type Step struct {
	Name string `json:"name"`
	// Command is the shell run remotely (never secrets: those go on stdin).
	Command string `json:"command"`
	// ExitCode is the command's status; -1 when it did not finish.
	ExitCode int           `json:"exitCode"`
	Duration time.Duration `json:"duration"`
	// Attempts counts tries (connect retries); 0 means one.
	Attempts int `json:"attempts,omitempty"`
	// Skipped is true when the step had nothing to do.
	Skipped bool `json:"skipped,omitempty"`
	// Stdout is kept for the probe only (it is what decisions were made
	// from); StderrTail is the last StderrTailBytes of stderr.
	Stdout     string `json:"stdout,omitempty"`
	StderrTail string `json:"stderrTail,omitempty"`
	Error      string `json:"error,omitempty"`
}

// StderrTailBytes is how much of a command's stderr a Step keeps.
const StderrTailBytes = 2048

func (t *Transcript) add(s Step) {
	t.Steps = append(t.Steps, s)
}

// tail keeps the last n bytes of b.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
