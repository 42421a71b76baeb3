package report

import "testing"

func TestDetectOOM(t *testing.T) {
	code := func(n int) *int { return &n }
	cases := []struct {
		name, log string
		exit      *int
		signal    string
		kind      string
	}{
		{"torch", "x\ntorch.cuda.OutOfMemoryError: CUDA out of memory.\n", code(1), "", "gpu"},
		{"jax", "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1234 bytes\n", code(1), "", "gpu"},
		{"cublas", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate\n", code(1), "", "gpu"},
		{"python", "MemoryError\n", code(1), "", "host"},
		{"killed", "step 3\nKilled\n", code(137), "", "host"},
		{"sigkill", "step 3\n", nil, "SIGKILL", "host"},
		{"plain crash", "ValueError: bad shape\n", code(1), "", ""},
		{"segfault", "boom\n", nil, "SIGSEGV", ""},
	}
	for _, c := range cases {
		kind, ev := detectOOM([]byte(c.log), c.exit, c.signal)
		if kind != c.kind || (kind != "" && ev == "") {
			t.Errorf("%s: got %q %q, want %q", c.name, kind, ev, c.kind)
		}
	}
}
