package runtime

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"
)

// benchStarts starts `true` b.N times through rt and reports the
// start-to-exit latency's p50 and p99 (run with -benchtime 200x for the
// figures in docs/benchmarks.md).
func benchStarts(b *testing.B, rt Runtime, image string) {
	var out syncBuffer
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		p, e := rt.Start(context.Background(), &Job{ID: "bench-1", Team: "nlp", Image: image, Memory: 256 << 20,
			Argv: []string{"true"}, Env: []string{"PATH=" + os.Getenv("PATH")}, Output: &out})
		if e != nil {
			b.Fatalf("start: %+v", e)
		}
		if x := p.Wait(); x.Code != 0 {
			b.Fatalf("exit %+v: %s", x, out.String())
		}
		durs = append(durs, time.Since(t0))
		b.StopTimer()
		rt.Forget("bench-1")
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(durs)
	pct := func(p float64) float64 {
		return float64(durs[min(len(durs)-1, int(p*float64(len(durs))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// BenchmarkStartProcess: the hardened process runtime (uid switch, 0700
// directory, memory cgroup) from start to exit of `true`.
func BenchmarkStartProcess(b *testing.B) {
	needRoot(b)
	benchStarts(b, newProcess(b), "")
}

// BenchmarkStartOCI: the same through Podman (cached image, own network
// namespace, memory cgroup).
func BenchmarkStartOCI(b *testing.B) {
	rt, img := newOCIRuntime(b)
	benchStarts(b, rt, img)
}
