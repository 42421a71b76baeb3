package workdir

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func names(t *testing.T, a *Archive) []string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(a.Data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var out []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			out = append(out, h.Name)
		}
	}
	return out
}

func TestPackHonoursIgnoreFiles(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{
		"train.py":              "print(1)",
		".gitignore":            "*.pyc\n/build/\nlogs/\n!keep.log\n# a comment\n",
		".spillwayignore":       "data/\n**/*.ckpt\n",
		"a.pyc":                 "x",
		"pkg/b.pyc":             "x",
		"pkg/model.py":          "m",
		"build/out.o":           "o",
		"pkg/build/keep.txt":    "anchored /build/ only at the top",
		"logs/run.log":          "l",
		"keep.log":              "k",
		"data/big.bin":          "d",
		"pkg/deep/w.ckpt":       "c",
		".git/HEAD":             "ref",
		"sub/.gitignore":        "secret.txt\n",
		"sub/secret.txt":        "s",
		"sub/public.txt":        "p",
		"other/secret.txt":      "not covered by sub/.gitignore",
		".spillwayignore.extra": "kept",
	})
	a, err := Pack(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := names(t, a)
	want := []string{".gitignore", ".spillwayignore", ".spillwayignore.extra", "keep.log", "other/secret.txt", "pkg/build/keep.txt", "pkg/model.py", "sub/.gitignore", "sub/public.txt", "train.py"}
	if !slices.Equal(got, want) {
		t.Fatalf("packed %q\nwant   %q", got, want)
	}
}

func TestPackIsDeterministic(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{"a.txt": "a", "d/b.txt": "b"})
	a1, err := Pack(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(root, "a.txt"), a1Time(), a1Time())
	a2, _ := Pack(root, 0)
	if a1.Hash != a2.Hash {
		t.Fatalf("same content, different hash: %s %s", a1.Hash, a2.Hash)
	}
	write(t, root, map[string]string{"a.txt": "changed"})
	a3, _ := Pack(root, 0)
	if a3.Hash == a1.Hash {
		t.Fatal("changed content, same hash")
	}
}

func TestPackOverCapFailsBeforeReading(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{"small.txt": "s", "weights.bin": strings.Repeat("w", 3<<20)})
	_, err := Pack(root, 1<<20)
	var tl *TooLargeError
	if !errors.As(err, &tl) || !strings.Contains(err.Error(), "over the 1.0 MiB cap") || !strings.Contains(err.Error(), "weights.bin (3.0 MiB)") || !strings.Contains(err.Error(), ".spillwayignore") {
		t.Fatalf("got %v", err)
	}
}

func TestUnpackRoundTrip(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{"input.txt": "hello", "d/e/f.txt": "deep"})
	os.Chmod(filepath.Join(root, "input.txt"), 0o755)
	os.Symlink("d/e/f.txt", filepath.Join(root, "link"))
	a, err := Pack(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := Unpack(bytes.NewReader(a.Data), dst, MaxUnpacked); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(filepath.Join(dst, "link")); string(raw) != "deep" {
		t.Fatalf("link reads %q", raw)
	}
	st, _ := os.Stat(filepath.Join(dst, "input.txt"))
	if st.Mode().Perm()&0o100 == 0 {
		t.Fatalf("the exec bit was lost: %v", st.Mode())
	}
}

// evil builds an archive by hand.
func evil(t *testing.T, hdrs ...*tar.Header) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, h := range hdrs {
		tw.WriteHeader(h)
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func TestUnpackRefusesEscapes(t *testing.T) {
	for name, data := range map[string][]byte{
		"dot-dot":          evil(t, &tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}),
		"absolute":         evil(t, &tar.Header{Name: "/etc/escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}),
		"link out":         evil(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}),
		"absolute link":    evil(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}),
		"through a link":   evil(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "d"}, &tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}),
		"device":           evil(t, &tar.Header{Name: "dev", Typeflag: tar.TypeChar, Mode: 0o644}),
		"expands past cap": evil(t, &tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 2 << 10, Mode: 0o644}),
	} {
		dst := t.TempDir()
		if err := Unpack(bytes.NewReader(data), filepath.Join(dst, "w"), 1<<10); err == nil {
			t.Errorf("%s: unpacked", name)
		}
		if _, err := os.Stat(filepath.Join(dst, "escape")); err == nil {
			t.Errorf("%s: wrote outside", name)
		}
	}
}

func a1Time() (t time.Time) { return time.Unix(1_000_000, 0) }
