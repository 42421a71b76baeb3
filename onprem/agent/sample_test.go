package agent

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/gpu"
)

// countingBackend counts reads of the cards; each read takes a moment.
type countingBackend struct {
	gpu.Backend
	n atomic.Int32
}

func (c *countingBackend) Sample() (gpu.Sample, error) {
	c.n.Add(1)
	// Kept: a read of real cards takes a moment. The assertions count
	// reads per moment asked for and do not depend on how long one takes.
	time.Sleep(20 * time.Millisecond)
	return gpu.Sample{}, nil
}

// TestSamplerSharesReads: callers that ask for a sample begun after the
// same moment share one read; asking for one after a later moment reads
// again.
func TestSamplerSharesReads(t *testing.T) {
	var sp sampler
	be := &countingBackend{}
	since := time.Now()
	var wg sync.WaitGroup
	// The first caller reads; the others, asking for the same moment,
	// wait for it and take its sample.
	if _, took, err := sp.since(be, since); err != nil || !took {
		t.Fatalf("first caller: took %v, err %v", took, err)
	}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, took, err := sp.since(be, since); err != nil || took {
				t.Errorf("a caller read again: took %v, err %v", took, err)
			}
		}()
	}
	wg.Wait()
	if got := be.n.Load(); got != 1 {
		t.Fatalf("%d reads for 17 callers of one moment, want 1", got)
	}
	if _, took, _ := sp.since(be, time.Now()); !took || be.n.Load() != 2 {
		t.Fatalf("a later moment did not read again (took %v, %d reads)", took, be.n.Load())
	}
}
