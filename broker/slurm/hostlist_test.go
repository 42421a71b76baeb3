package slurm

import (
	"slices"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"a plain name", "burst-1", []string{"burst-1"}},
		{"a list of plain names", "a,b,c", []string{"a", "b", "c"}},
		{"a range and a single in one group", "burst-[1-4,7]", []string{"burst-1", "burst-2", "burst-3", "burst-4", "burst-7"}},
		{"two groups with padding", "burst-[1-2],gpu-a[01-03]", []string{"burst-1", "burst-2", "gpu-a01", "gpu-a02", "gpu-a03"}},
		{"padding crosses a decade", "n[08-11]", []string{"n08", "n09", "n10", "n11"}},
		{"a suffix after the group", "rack[1-2]-gpu", []string{"rack1-gpu", "rack2-gpu"}},
		{"two groups multiply", "r[1-2]n[1-2]", []string{"r1n1", "r1n2", "r2n1", "r2n2"}},
		{"spaces around items", " a , b[1-2] ", []string{"a", "b1", "b2"}},
		{"a zero", "n[0-1]", []string{"n0", "n1"}},
		{"only brackets", "[1-2]", []string{"1", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Expand(tc.in)
			if err != nil {
				t.Fatalf("Expand(%q): %v", tc.in, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Expand(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestExpandErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"a,,b", "empty name"},
		{"burst-[1-4", "without ']'"},
		{"burst-1-4]", "without '['"},
		{"n[4-1]", "end below start"},
		{"n[a-b]", "decimal digits"},
		{"n[]", "empty brackets"},
		{"n[1-]", "decimal digits"},
		{"n[[1-2]]", "nested"},
		{"n[0-999999999]", "more than 65536 hosts"},
		{"n[1-300]m[1-300]", "more than 65536 hosts"},
		{"bad name;rm", "not allowed"},
		{"n\x1b[1-2]", "not allowed"},
		{"n[1234567890]", "decimal digits"},
	} {
		_, err := Expand(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Expand(%q) error = %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

func TestCompress(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{"burst-1", "burst-2", "burst-3", "burst-7"}, "burst-[1-3,7]"},
		{[]string{"gpu-a01", "gpu-a02", "x"}, "gpu-a[01-02],x"},
		{[]string{"n1"}, "n1"},
		{[]string{"n2", "n1"}, "n2,n1"},
		{nil, ""},
	} {
		if got := Compress(tc.in); got != tc.want {
			t.Errorf("Compress(%v) = %q, want %q", tc.in, got, tc.want)
		}
		if len(tc.in) > 0 {
			back, err := Expand(Compress(tc.in))
			if err != nil || !slices.Equal(back, tc.in) {
				t.Errorf("Expand(Compress(%v)) = %v, %v", tc.in, back, err)
			}
		}
	}
}

// FuzzExpand checks that no input panics or runs away, that every name is
// a valid node name, and that compressing and expanding again gives the
// same names.
func FuzzExpand(f *testing.F) {
	for _, s := range []string{"burst-[1-4,7],gpu-a[01-03]", "a,b", "r[1-2]n[08-11]", "n[", "n]", "[1-2]", "x[0-65535]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := Expand(s)
		if err != nil {
			return
		}
		if len(names) == 0 || len(names) > MaxHosts {
			t.Fatalf("Expand(%q) gave %d names", s, len(names))
		}
		for _, n := range names {
			if err := checkName(n); err != nil {
				t.Fatalf("Expand(%q) gave bad name %q: %v", s, n, err)
			}
		}
		back, err := Expand(Compress(names))
		if err != nil || !slices.Equal(back, names) {
			t.Fatalf("round trip of %q: %v, %v", s, back, err)
		}
	})
}

// BenchmarkExpand expands a hostlist of 1,000 nodes in three groups, the
// size of a large burst partition's ResumeProgram argument.
func BenchmarkExpand(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := Expand("burst-[0001-0500],gpu-a[001-400],r[1-10]n[1-10]"); err != nil {
			b.Fatal(err)
		}
	}
}
