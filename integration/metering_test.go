package integration

import (
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
)

// TestMeteringSurvivesKill9 kills the broker with SIGKILL 50 times while
// jobs run and the meter writes one-second slices, restarting it each
// time. Afterwards every job's ledger is one unbroken run of slices from
// the moment it got its GPUs to the moment it gave them back: no slice
// lost, none counted twice.
func TestMeteringSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("50 broker crashes take about a minute")
	}
	c := newCluster(t, `billing:
  slice: 1s
  onprem:
    rates:
      H100: [{perGPUHour: "2.00"}]
`)
	c.agent("node-a", "sim:8xH100-80GB")
	c.waitNodes(1)
	ctx := context.Background()
	cl := c.client(tokAlice)
	release := filepath.Join(c.dir, "release")
	var ids []string
	for _, gpus := range []int{1, 2, 4} {
		j, err := cl.SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: gpus}, Timeout: broker.Duration(10 * time.Minute),
			Command: []string{"sh", "-c", "while [ ! -e " + release + " ]; do sleep 0.1; done"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	for _, id := range ids {
		c.waitJob(id, 10*time.Second, "running", func(s string) bool { return s == "running" })
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 50; i++ {
		// Kept: the broker runs a random while between kills, so kills
		// land at any point of a metering cycle. The checks read the
		// ledger afterwards and hold wherever the kills fell.
		time.Sleep(time.Duration(100+rng.Intn(500)) * time.Millisecond)
		c.broker.kill()
		c.startBroker()
	}
	os.WriteFile(release, nil, 0o600)
	for _, id := range ids {
		c.waitJob(id, 15*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	}
	c.waitJobsMetered(ids...)
	if err := c.broker.stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	st, err := bolt.Open(filepath.Join(c.dir, "data", bolt.FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	byJob := map[string][]billing.Entry{}
	if err := (broker.Ledger{Store: st}).Scan(ctx, time.Time{}, time.Time{}, func(e billing.Entry) error {
		byJob[e.Job] = append(byJob[e.Job], e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		gpus := int64([]int{1, 2, 4}[i])
		var j *broker.Job
		st.View(ctx, func(tx broker.Tx) error {
			j, err = broker.GetJob(tx, id)
			return err
		})
		es := byJob[id]
		slices.SortFunc(es, func(a, b billing.Entry) int { return a.Start.Compare(b.Start) })
		if len(es) < 15 {
			t.Fatalf("job %s: only %d ledger entries", id, len(es))
		}
		var total int64
		for k, e := range es {
			if k > 0 && !e.Start.Equal(es[k-1].End) {
				t.Fatalf("job %s: entry %d starts at %s but the previous ends at %s (gap or overlap)", id, k, e.Start, es[k-1].End)
			}
			if want := e.End.Sub(e.Start).Milliseconds() * gpus; e.GPUMillis != want {
				t.Fatalf("job %s: entry %d holds %d GPU-ms for %s × %d GPUs", id, k, e.GPUMillis, e.End.Sub(e.Start), gpus)
			}
			total += e.GPUMillis
		}
		// From the scheduling (GPUs given) to the recorded end (taken back).
		given := j.History[1].At
		taken := *j.EndedAt
		want := taken.Sub(given).Milliseconds() * gpus
		if diff := total - want; diff < -2000*gpus || diff > 2000*gpus {
			t.Errorf("job %s: ledger %d GPU-ms, allocation %d GPU-ms (%s × %d)", id, total, want, taken.Sub(given), gpus)
		}
	}
}
