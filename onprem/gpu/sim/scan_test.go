package sim

import (
	"os"
	"path/filepath"
	"testing"
)

// TestScanSkipsKnownNonGPUProcesses: a process found without
// CUDA_VISIBLE_DEVICES is not read again within withoutTTL (so a burst of
// samples reads only new processes), and a pid that left the process
// table and came back is read again at once.
func TestScanSkipsKnownNonGPUProcesses(t *testing.T) {
	uuids := newBackend(t, "2xA100-40GB", "node-a", Options{}).UUIDs()
	root := fakeProc(t, map[string][]string{
		"100": {"PATH=/bin"},
		"200": {"CUDA_VISIBLE_DEVICES=" + uuids[0]},
	})
	b := newBackend(t, "2xA100-40GB", "node-a", Options{ProcRoot: root, Now: fixedClock})
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
	// 100 now claims a card without leaving the table: trusted as
	// without for withoutTTL.
	env := []byte("CUDA_VISIBLE_DEVICES=" + uuids[1] + "\x00")
	if err := os.WriteFile(filepath.Join(root, "100", "environ"), env, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := holders(); got[100] {
		t.Fatalf("pid 100 read again within the TTL: %v", got)
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
