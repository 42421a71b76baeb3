package sim

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestScanSkipsKnownNonGPUProcesses: a process found without
// CUDA_VISIBLE_DEVICES, or whose environment cannot be read (a kernel
// thread's), is not read again within withoutTTL (so a burst of samples
// reads only new processes), is read again after it, and a pid that left
// the process table and came back is read again at once.
func TestScanSkipsKnownNonGPUProcesses(t *testing.T) {
	uuids := newBackend(t, "2xA100-40GB", "node-a", Options{}).UUIDs()
	root := fakeProc(t, map[string][]string{
		"100": {"PATH=/bin"},
		"200": {"CUDA_VISIBLE_DEVICES=" + uuids[0]},
		"300": nil, // no environ to read
	})
	now := t0
	b := newBackend(t, "2xA100-40GB", "node-a", Options{ProcRoot: root, Now: func() time.Time { return now }})
	holders := func() map[int]bool {
		t.Helper()
		s, err := b.Sample()
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]bool{}
		for _, d := range s.Devices {
			for _, p := range d.Processes {
				out[p.PID] = true
			}
		}
		return out
	}
	if got := holders(); !got[200] || got[100] {
		t.Fatalf("first sample: %v", got)
	}
	// 100 and 300 now claim a card without leaving the table: trusted
	// as without for withoutTTL, then read again.
	env := []byte("CUDA_VISIBLE_DEVICES=" + uuids[1] + "\x00")
	for _, pid := range []string{"100", "300"} {
		if err := os.WriteFile(filepath.Join(root, pid, "environ"), env, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(withoutTTL - time.Millisecond)
	if got := holders(); got[100] || got[300] {
		t.Fatalf("pids 100 and 300 read again within the TTL: %v", got)
	}
	now = now.Add(time.Millisecond)
	if got := holders(); !got[100] || !got[300] {
		t.Fatalf("pids 100 and 300 not read again after the TTL: %v", got)
	}
	if err := os.WriteFile(filepath.Join(root, "100", "environ"), []byte("PATH=/bin\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	holders() // 100 is without again, for another TTL
	if err := os.WriteFile(filepath.Join(root, "100", "environ"), env, 0o644); err != nil {
		t.Fatal(err)
	}
	// 100 leaves the table: the next listing forgets it; when a process
	// with that pid appears again it is read at once.
	if err := os.Rename(filepath.Join(root, "100"), filepath.Join(root, "gone")); err != nil {
		t.Fatal(err)
	}
	holders()
	if err := os.Rename(filepath.Join(root, "gone"), filepath.Join(root, "100")); err != nil {
		t.Fatal(err)
	}
	if got := holders(); !got[100] || !got[200] {
		t.Fatalf("a new process under a recycled pid was not read: %v", got)
	}
}
