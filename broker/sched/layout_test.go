package sched

import (
	"testing"
	"unsafe"
)

// TestPendingRecordIsOneCacheLine guards the pjob layout: a cycle copies
// each of ~100,000 pjobs twice (loaded, then laid out in order) and the
// walk reads them; at 64 bytes each is one cache line.
func TestPendingRecordIsOneCacheLine(t *testing.T) {
	if n := unsafe.Sizeof(pjob{}); n != 64 {
		t.Fatalf("pjob is %d bytes, want 64", n)
	}
}
