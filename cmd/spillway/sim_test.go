package main

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const simTestCluster = `
broker:
  burst: {threshold: 0.8, minWait: 1m, idleTTL: 1m}
nodes:
  - {name: n, count: 1, gpus: 4, model: "Tesla P100", memory: 16Gi}
burst:
  leadTime: {p50: 1m, p99: 1m, max: 1m}
offers:
  - {provider: cloud, instanceType: one, gpuModel: V100, gpus: 1, pricePerHour: "3"}
budgets: {global: "1000"}
`

func writeFiles(t *testing.T) (trace, cluster string) {
	t.Helper()
	dir := t.TempDir()
	trace, cluster = filepath.Join(dir, "trace.csv"), filepath.Join(dir, "cluster.yaml")
	rows := "submit_s,duration_s,gpus,team,priority,queue\n"
	for i := 0; i < 6; i++ {
		rows += "0,3600,1,nlp,medium,default\n"
	}
	if err := os.WriteFile(trace, []byte(rows), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cluster, []byte(simTestCluster), 0o600); err != nil {
		t.Fatal(err)
	}
	return trace, cluster
}

func TestSimCommand(t *testing.T) {
	trace, cluster := writeFiles(t)
	chart := filepath.Join(t.TempDir(), "chart.svg")
	out, errOut, code := run(t, "sim", "--trace", trace, "--cluster", cluster, "--policy", "no-burst,spillway", "-o", "json", "--chart", chart)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Trace   struct{ Jobs int }
		Results []struct {
			Policy      string
			JobsOnBurst int
			BurstCost   string
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	// Six 1-hour jobs on 4 GPUs: two burst after the 1-minute minimum
	// wait, each on a 1-GPU machine at 3 USD/h for 1 + 60 + 1 minutes.
	if rep.Trace.Jobs != 6 || len(rep.Results) != 2 || rep.Results[0].JobsOnBurst != 0 || rep.Results[1].JobsOnBurst != 2 ||
		rep.Results[1].BurstCost != "6.20" {
		t.Fatalf("report %+v", rep)
	}
	raw, err := os.ReadFile(chart)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(raw, new(struct{})); err != nil {
		t.Fatalf("the chart is not XML: %v", err)
	}

	out, _, code = run(t, "sim", "--trace", trace, "--cluster", cluster, "--policy", "spillway")
	if code != 0 || !strings.Contains(out, "fluid lower bound on burst GPU-hours: 2") || !strings.Contains(out, "spillway") {
		t.Fatalf("table output (exit %d):\n%s", code, out)
	}
}

// TestSimPrices: --prices changes the offers' prices over virtual time;
// a bad row is an error naming its line and field.
func TestSimPrices(t *testing.T) {
	trace, cluster := writeFiles(t)
	prices := filepath.Join(t.TempDir(), "prices.csv")
	if err := os.WriteFile(prices, []byte("time,provider,instanceType,price\n1900-01-01T00:00:00Z,cloud,one,6\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, "sim", "--trace", trace, "--cluster", cluster, "--policy", "spillway", "-o", "json", "--prices", prices)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct{ Results []struct{ BurstCost string } }
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	// TestSimCommand's two machines at twice the price.
	if len(rep.Results) != 1 || rep.Results[0].BurstCost != "12.40" {
		t.Fatalf("report %+v", rep)
	}
	if err := os.WriteFile(prices, []byte("time,provider,instanceType,price\n1900-01-01T00:00:00Z,cloud,two,6\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = run(t, "sim", "--trace", trace, "--cluster", cluster, "--policy", "spillway", "--prices", prices)
	if want := "line 2: instanceType: no spot or on-demand offer of cloud two"; code == 0 || !strings.Contains(errOut, want) {
		t.Fatalf("exit %d, stderr %q; want %q", code, errOut, want)
	}
}

func TestSimCommandErrors(t *testing.T) {
	trace, cluster := writeFiles(t)
	cases := map[string][]string{
		"--trace and --cluster are required": {"sim", "--cluster", cluster},
		"unknown policy":                     {"sim", "--trace", trace, "--cluster", cluster, "--policy", "karpenter"},
		"--from":                             {"sim", "--trace", trace, "--cluster", cluster, "--from", "yesterday"},
		"--format must be":                   {"sim", "--trace", trace, "--cluster", cluster, "--format", "xls"},
		"no jobs":                            {"sim", "--trace", trace, "--cluster", cluster, "--from", "2030-01-01"},
		"open trace":                         {"sim", "--trace", trace + ".missing", "--cluster", cluster},
	}
	for want, args := range cases {
		_, errOut, code := run(t, args...)
		if code == 0 || !strings.Contains(errOut, want) {
			t.Errorf("%v: exit %d, stderr %q; want an error mentioning %q", args, code, errOut, want)
		}
	}
}

// TestSimSacct: Slurm accounting is a trace, picked by its header with
// --format auto as with --format sacct.
func TestSimSacct(t *testing.T) {
	_, cluster := writeFiles(t)
	trace := filepath.Join(t.TempDir(), "sacct.txt")
	dump := "JobID|Submit|Start|End|AllocTRES|Account|Partition|State\n" +
		"1|2026-12-01T16:00:00|2026-12-01T16:00:10|2026-12-01T17:00:10|billing=1,cpu=1,gres/gpu=1,node=1|nlp|burst|COMPLETED\n" +
		"1.batch|2026-12-01T16:00:10|2026-12-01T16:00:10|2026-12-01T17:00:10|cpu=1,gres/gpu=1|nlp||COMPLETED\n" +
		"2|2026-12-01T16:01:00|2026-12-01T16:01:00|2026-12-01T16:31:00|billing=1,cpu=1,gres/gpu=2,node=1|vision|burst|COMPLETED\n"
	if err := os.WriteFile(trace, []byte(dump), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"sacct", "auto"} {
		out, errOut, code := run(t, "sim", "--trace", trace, "--format", format, "--cluster", cluster, "--policy", "no-burst", "-o", "json")
		if code != 0 {
			t.Fatalf("--format %s: exit %d: %s", format, code, errOut)
		}
		var rep struct {
			Trace   struct{ Jobs int }
			Results []struct{ Jobs, Succeeded int }
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Trace.Jobs != 2 || len(rep.Results) != 1 || rep.Results[0].Succeeded != 2 {
			t.Fatalf("--format %s: %v %+v", format, err, rep)
		}
	}
}
