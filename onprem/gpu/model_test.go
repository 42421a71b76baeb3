package gpu

import "testing"

func TestShortModel(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3": "H100", "NVIDIA A100-SXM4-80GB": "A100", "Tesla V100-SXM2-32GB": "V100",
		"NVIDIA H200": "H200", "NVIDIA L4": "L4", "H100": "H100", "": "",
	} {
		if got := ShortModel(in); got != want {
			t.Errorf("ShortModel(%q) = %q, want %q", in, got, want)
		}
	}
}
