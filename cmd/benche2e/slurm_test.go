package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadSlurmRecord(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "j0.x")
	// Preempted once (Slurm's SIGTERM), then run to the end.
	if err := os.WriteFile(p, []byte("start 100.5\nstop 102.5\nstart 110.25\nend 113.25\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := readSlurmRecord(p, Item{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.started || !o.ok || o.attempts != 2 || o.state != "completed" {
		t.Fatalf("outcome %+v, want started, ok, 2 attempts, completed", o)
	}
	if got := o.first.Sub(time.Unix(100, 5e8)); got != 0 {
		t.Fatalf("first start off by %v", got)
	}
	if o.last.Before(o.first) || o.end.Sub(o.last) != 3*time.Second || o.runS != 5 {
		t.Fatalf("last %v end %v run %v s, want the second attempt's 3 s and 5 s in all", o.last, o.end, o.runS)
	}
	// Started and never ended: not ok.
	if err := os.WriteFile(p, []byte("start 100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := readSlurmRecord(p, Item{ID: "a"}); err != nil || o.ok || !o.end.IsZero() {
		t.Fatalf("unfinished record: %+v, %v", o, err)
	}
	if o, err := readSlurmRecord(filepath.Join(dir, "none"), Item{ID: "a"}); err != nil || o.started {
		t.Fatalf("missing record: %+v, %v; want never started", o, err)
	}
	if err := os.WriteFile(p, []byte("begin 100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readSlurmRecord(p, Item{ID: "a"}); err == nil || !strings.Contains(err.Error(), "bad line") {
		t.Fatalf("bad record read as %v", err)
	}
}

func TestSlurmRejectsSpillwayOnlyFlags(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.jsonl")
	if err := os.WriteFile(p, []byte(`{"id":"a","submit_s":0,"gpus":1,"duration_s":0,"priority":"high","team":"x"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run([]string{"-system", "slurm", "-workload", p, "-history", "h.jsonl", "-team-quota", "4"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "-history") || !strings.Contains(err.Error(), "-team-quota") {
		t.Fatalf("got %v, want both flags named", err)
	}
	if err := run([]string{"-system", "pbs", "-workload", p}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "-system") {
		t.Fatalf("got %v, want -system named", err)
	}
}

// requireSlurm skips the test without Slurm or root, or fails it under
// CI=true: CI must run it.
func requireSlurm(t *testing.T) {
	t.Helper()
	var missing []string
	for _, b := range []string{"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"} {
		if _, err := os.Stat(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, b := range []string{"sbatch", "squeue", "scontrol", "sinfo", "scancel"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	msg := ""
	switch {
	case len(missing) > 0:
		msg = "missing " + strings.Join(missing, ", ") + ": apt-get install -y slurmctld slurmd slurm-client munge (or run .ci/run)"
	case os.Geteuid() != 0:
		msg = "-system slurm runs slurmctld and slurmd as root; run the test as root"
	default:
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// TestSlurmReplay replays a small workload on a real Slurm: two slurmd of
// two GPUs each, the three class partitions, low jobs preemptible.
func TestSlurmReplay(t *testing.T) {
	requireSlurm(t)
	o := options{agents: 2, gpusPerAgent: 2, preemptLow: true, timeoutSlack: 5 * time.Second}
	s, err := startSlurm(o)
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string][]string{
		"high": {"PriorityTier=3", "PreemptMode=OFF", "TotalNodes=2"},
		"low":  {"PriorityTier=1", "PreemptMode=REQUEUE", "TotalNodes=2"},
	}
	for name, wants := range parts {
		out, err := s.run("scontrol", "-o", "show", "partition", name)
		if err != nil {
			s.stop(false)
			t.Fatal(err)
		}
		for _, want := range wants {
			if !strings.Contains(out, want) {
				s.stop(false)
				t.Fatalf("partition %s: no %s in %s", name, want, out)
			}
		}
	}
	s.stop(false)

	dir := t.TempDir()
	w := filepath.Join(dir, "w.jsonl")
	lines := `{"id":"a","submit_s":0,"gpus":2,"duration_s":0.5,"priority":"low","team":"x"}
{"id":"b","submit_s":0,"gpus":1,"duration_s":0,"priority":"high","team":"x"}
{"id":"c","submit_s":0.1,"gpus":2,"duration_s":0.2,"priority":"medium","team":"y"}
{"id":"d","submit_s":0.1,"gpus":1,"duration_s":0,"priority":"medium","team":"y"}
{"id":"e","submit_s":0.1,"gpus":1,"duration_s":0,"priority":"medium","team":"y"}
`
	if err := os.WriteFile(w, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	csv := filepath.Join(dir, "jobs.csv")
	var buf bytes.Buffer
	if err := run([]string{"-system", "slurm", "-workload", w, "-agents", "2", "-gpus", "2", "-preemptible-low", "-mode", "array", "-jobs", csv}, &buf); err != nil {
		t.Fatal(err)
	}
	t.Log(buf.String())
	if !strings.Contains(buf.String(), "slurm, workload w.jsonl: 5 jobs, mode array (4 submit calls), 2 agents × 2 GPUs, preemptible low: true") ||
		strings.Contains(buf.String(), "NOT SUCCEEDED") {
		t.Fatalf("summary:\n%s", buf.String())
	}
	raw, err := os.ReadFile(csv)
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(string(raw)), "\n")[1:]
	if len(rows) != 5 {
		t.Fatalf("%d job lines, want 5:\n%s", len(rows), raw)
	}
	for _, r := range rows {
		f := strings.Split(r, ",")
		if f[9] != "completed" || f[6] == "-1.000" || strings.HasPrefix(f[8], "-") {
			t.Fatalf("job line %q: want completed with a start and a wait ≥ 0", r)
		}
	}
}
