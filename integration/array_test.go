package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/client"
)

// TestArrayThroughCLI: `spillway submit --array 0-4` is one call that
// makes five jobs; a real agent runs each with its own
// SPILLWAY_ARRAY_INDEX, and each has its own log and history.
func TestArrayThroughCLI(t *testing.T) {
	c := newCluster(t, "")
	c.agent("node-a", "sim:2xH100-80GB")
	c.waitNodes(1)

	spec := filepath.Join(c.dir, "array.yaml")
	os.WriteFile(spec, []byte("name: shards\nresources: {gpus: 1}\ntimeout: 5m\n"+
		"command: [\"sh\", \"-c\", \"echo shard=$SPILLWAY_ARRAY_INDEX of $SPILLWAY_ARRAY_JOB_ID\"]\n"), 0o600)
	out, errOut, code := c.cli(tokAlice, "--output", "json", "submit", "-f", spec, "--array", "0-4")
	if code != 0 {
		t.Fatalf("submit --array: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	ids := regexp.MustCompile(`"jobs":\s*\[([^\]]*)\]`).FindStringSubmatch(out)
	arrayID := regexp.MustCompile(`"arrayId":\s*"([^"]+)"`).FindStringSubmatch(out)
	if ids == nil || arrayID == nil {
		t.Fatalf("no array in the answer: %s", out)
	}
	var jobs []string
	for _, q := range strings.Split(ids[1], ",") {
		jobs = append(jobs, strings.Trim(strings.TrimSpace(q), `"`))
	}
	if len(jobs) != 5 {
		t.Fatalf("%d jobs, want 5: %s", len(jobs), out)
	}
	cl := c.client(tokAlice)
	for k, id := range jobs {
		c.waitJob(id, 60*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
		var log strings.Builder
		if err := cl.Logs(context.Background(), id, client.LogOptions{Tail: -1}, &log); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("shard=%d of %s\n", k, arrayID[1]); log.String() != want {
			t.Fatalf("job %s (index %d) logged %q, want %q", id, k, log.String(), want)
		}
		j, err := cl.Job(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if j.ArrayID != arrayID[1] || j.ArrayIndex == nil || *j.ArrayIndex != k || len(j.History) < 4 {
			t.Fatalf("job %s: array %q index %v, %d transitions", id, j.ArrayID, j.ArrayIndex, len(j.History))
		}
	}
}
