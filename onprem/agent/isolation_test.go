package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// The isolation rules of the process runtime, each a job that tries and
// fails. They need the agent to be root (it switches the jobs to
// unprivileged uids); CI runs them as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("isolation tests need root (the agent switches jobs to unprivileged uids); CI runs them as root")
		}
		t.Skip("isolation tests need root: run as root, or with CI=true under .ci/run")
	}
}

// assignAs queues an attempt of a team's job with extra variables.
func (r *rig) assignAs(job, team string, env map[string]string, argv ...string) {
	r.fb.mu.Lock()
	defer r.fb.mu.Unlock()
	e := map[string]string{"SPILLWAY_JOB_ID": job}
	for k, v := range env {
		e[k] = v
	}
	r.fb.pending = append(r.fb.pending, agentapi.Assignment{
		JobRef: agentapi.JobRef{Job: job, Attempt: 1}, Team: team, Argv: argv, Env: e,
		Timeout: time.Minute, Signal: "SIGTERM", Grace: time.Second,
	})
}

func (r *rig) log(job string) string {
	r.fb.mu.Lock()
	defer r.fb.mu.Unlock()
	return string(r.fb.logs[agentapi.JobRef{Job: job, Attempt: 1}])
}

// waitLog waits until a job's log holds want.
func (r *rig) waitLog(job, want string) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(r.log(job), want) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("job %s never logged %q; log: %q", job, want, r.log(job))
}

// victim starts a vision job holding a secret in its environment, its
// log and its workdir, and waits until it runs.
func victim(r *rig) {
	r.assignAs("victim", "vision", map[string]string{"HF_TOKEN": "hf-secret-of-vision"},
		"sh", "-c", `echo log-secret-of-vision; echo file-secret-of-vision > "$HOME/secret"; echo ready; exec sleep 300`)
	r.waitLog("victim", "ready")
}

// attack runs an nlp job and returns its output.
func attack(r *rig, job, script string) string {
	r.t.Helper()
	r.assignAs(job, "nlp", nil, "sh", "-c", script)
	rep := r.waitEnded(job, 30*time.Second)
	out := r.log(job)
	r.t.Logf("%s exit %d: %s", job, rep.ExitCode, out)
	return out
}

func isolationRig(t *testing.T) *rig {
	needRoot(t)
	t.Setenv("SPILLWAY_AGENT_TOKEN", "agent-secret-token")
	return newRigWith(t, func(c *Config) {
		c.Runtime.Users = map[string]string{"nlp": "20901", "vision": "20902"}
	})
}

func TestIsolationCannotReadAgentEnvironment(t *testing.T) {
	r := isolationRig(t)
	out := attack(r, "env-thief", `cat /proc/$PPID/environ; tr '\0' '\n' < /proc/$PPID/environ; echo done`)
	if strings.Contains(out, "agent-secret-token") || !strings.Contains(out, "done") {
		t.Fatalf("a job read the agent's environment (or did not run): %q", out)
	}
	if !strings.Contains(out, "ermission denied") {
		t.Fatalf("want permission denied reading the agent's environ, got %q", out)
	}
	// Nor does it inherit it.
	out = attack(r, "env-inherit", `env; echo done`)
	if strings.Contains(out, "agent-secret-token") {
		t.Fatalf("the job inherited the agent's token: %q", out)
	}
}

func TestIsolationCannotReadAnotherJobsLog(t *testing.T) {
	r := isolationRig(t)
	victim(r)
	logs := filepath.Join(r.ag.cfg.DataDir, "logs")
	out := attack(r, "log-thief", `cat `+logs+`/victim-1.log; ls `+logs+`; cat `+logs+`/*; echo done`)
	if strings.Contains(out, "log-secret-of-vision") || !strings.Contains(out, "done") {
		t.Fatalf("a job read another team's log: %q", out)
	}
}

func TestIsolationCannotReadAnotherJobsWorkdir(t *testing.T) {
	r := isolationRig(t)
	victim(r)
	jobs := filepath.Dir(r.ag.jobDir("victim-1"))
	out := attack(r, "dir-thief", `cat `+jobs+`/victim-1/secret; ls `+jobs+`; ls `+jobs+`/victim-1; cat $HOME/../victim-1/secret; echo done`)
	if strings.Contains(out, "file-secret-of-vision") || strings.Contains(out, "victim-1\n") || !strings.Contains(out, "done") {
		t.Fatalf("a job read another team's workdir: %q", out)
	}
	st, err := os.Stat(r.ag.jobDir("victim-1"))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("attempt dir mode %v, %v; want 0700", st.Mode(), err)
	}
}

func TestIsolationCannotReadOtherProcessesEnvironment(t *testing.T) {
	r := isolationRig(t)
	victim(r)
	out := attack(r, "proc-thief", `for f in /proc/[0-9]*/environ; do cat "$f" 2>/dev/null; done | tr '\0' '\n' | grep -c . ; for f in /proc/[0-9]*/environ; do cat "$f" 2>/dev/null; done | tr "\\0" " "; echo done`)
	if strings.Contains(out, "hf-secret-of-vision") || strings.Contains(out, "agent-secret-token") || !strings.Contains(out, "done") {
		t.Fatalf("a job read another process's environment: %q", out)
	}
}

func TestIsolationCannotWriteOutsideItsDirs(t *testing.T) {
	r := isolationRig(t)
	victim(r)
	targets := []string{
		filepath.Join(r.ag.cfg.DataDir, "planted"),
		filepath.Join(r.ag.jobDir("victim-1"), "planted"),
		filepath.Join(r.ag.cfg.DataDir, "logs", "victim-1.log"),
		"/etc/spillway-planted",
		"/usr/local/bin/spillway-planted",
	}
	script := `echo mine > $HOME/own && echo wrote-own; `
	for _, p := range targets {
		script += `echo x >> ` + p + ` && echo WROTE ` + p + `; `
	}
	out := attack(r, "writer", script+`echo done`)
	if strings.Contains(out, "WROTE") || !strings.Contains(out, "wrote-own") || !strings.Contains(out, "done") {
		t.Fatalf("a job wrote outside its own directory: %q", out)
	}
	for _, p := range targets {
		if raw, err := os.ReadFile(p); err == nil && strings.Contains(string(raw), "x\n") && !strings.HasSuffix(p, ".log") {
			t.Fatalf("%s was written", p)
		}
	}
}

func TestIsolationNeverRoot(t *testing.T) {
	r := isolationRig(t)
	out := attack(r, "root", `id -u; cat /etc/shadow >/dev/null && echo READ-SHADOW; kill -0 1 && echo SIGNALLED-INIT; echo done`)
	if strings.HasPrefix(out, "0\n") || strings.Contains(out, "READ-SHADOW") || strings.Contains(out, "SIGNALLED-INIT") || !strings.Contains(out, "done") {
		t.Fatalf("a job ran with root's powers: %q", out)
	}
	if !strings.HasPrefix(out, "20901\n") {
		t.Fatalf("the nlp job should run as its team's uid 20901: %q", out)
	}
	// A team without an entry gets a uid from the range, not root.
	r.assignAs("unmapped", "newteam", nil, "id", "-u")
	r.waitEnded("unmapped", 30*time.Second)
	if got := strings.TrimSpace(r.log("unmapped")); got != "20000" {
		t.Fatalf("an unlisted team should get the first uid of the range, got %q", got)
	}
}

// jobDir is the host directory of a running attempt.
func (ag *Agent) jobDir(id string) string {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	for ref, r := range ag.runs {
		if attemptID(ref) == id && r.proc != nil {
			return r.proc.Dir()
		}
	}
	return "/nonexistent/" + id
}
