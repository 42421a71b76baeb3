// Package workdir packs a directory into a deterministic archive for
// `spillway run` (honouring .gitignore and .spillwayignore, under a size
// cap) and unpacks one safely on a node as a job's working directory.
// The archive's sha256 names it, so an unchanged directory is uploaded
// once.
package workdir

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Limits.
const (
	// DefaultMaxSize is the CLI's default cap on the files packed
	// (uncompressed).
	DefaultMaxSize = 500 << 20
	// MaxArchive is the largest compressed archive a broker accepts.
	MaxArchive = 1 << 30
	// MaxUnpacked bounds what an archive may expand to on a node.
	MaxUnpacked = 4 << 30
	maxEntries  = 200_000
)

// TooLargeError says the directory is over the cap, with the biggest
// entries to put in .spillwayignore.
type TooLargeError struct {
	Size, Max int64
	Biggest   []Entry
}

// Entry is a file and its size.
type Entry struct {
	Path string
	Size int64
}

func (e *TooLargeError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the working directory is %s, over the %s cap; large data does not belong in the upload: list it in .spillwayignore (or .gitignore), or raise the cap with --workdir-max", human(e.Size), human(e.Max))
	if len(e.Biggest) > 0 {
		b.WriteString("; biggest:")
		for _, x := range e.Biggest {
			fmt.Fprintf(&b, " %s (%s)", x.Path, human(x.Size))
		}
	}
	return b.String()
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// Archive is a packed directory.
type Archive struct {
	// Hash is "sha256:<hex>" of Data.
	Hash  string
	Data  []byte
	Files int
	// Size is the files' total size before compression.
	Size int64
}

// Pack walks root and archives every regular file, directory and
// symlink not excluded by a .gitignore or .spillwayignore (at any level)
// or inside .git. It checks the cap before reading any file content, so
// an oversized directory fails fast. The archive is deterministic: sorted
// names, no times, no owners.
func Pack(root string, maxSize int64) (*Archive, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	type item struct {
		rel  string
		info fs.FileInfo
	}
	var items []item
	var total int64
	rulesAt := map[string][]rule{}
	rulesFor := func(dirRel string) []rule {
		return rulesAt[dirRel]
	}
	load := func(dirAbs, dirRel string, parent []rule) {
		rs := slices.Clone(parent)
		rs = append(rs, readIgnore(filepath.Join(dirAbs, ".gitignore"), dirRel)...)
		rs = append(rs, readIgnore(filepath.Join(dirAbs, ".spillwayignore"), dirRel)...)
		rulesAt[dirRel] = rs
	}
	load(root, "", nil)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		parent := path.Dir(rel)
		if parent == "." {
			parent = ""
		}
		rs := rulesFor(parent)
		if d.Name() == ".git" || ignored(rs, rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			load(p, rel, rs)
		case info.Mode().IsRegular():
			total += info.Size()
		case info.Mode()&fs.ModeSymlink != 0:
		default:
			return nil // sockets, devices, fifos stay behind
		}
		items = append(items, item{rel, info})
		if len(items) > maxEntries {
			return fmt.Errorf("the working directory has more than %d entries; list what the job does not need in .spillwayignore", maxEntries)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", root, err)
	}
	if total > maxSize {
		var files []Entry
		for _, it := range items {
			if it.info.Mode().IsRegular() {
				files = append(files, Entry{it.rel, it.info.Size()})
			}
		}
		sort.Slice(files, func(i, j int) bool { return files[i].Size > files[j].Size })
		return nil, &TooLargeError{Size: total, Max: maxSize, Biggest: files[:min(3, len(files))]}
	}
	sort.Slice(items, func(i, j int) bool { return items[i].rel < items[j].rel })
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	tw := tar.NewWriter(gz)
	a := &Archive{}
	for _, it := range items {
		hdr := &tar.Header{Name: it.rel, Mode: int64(it.info.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case it.info.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, it.rel+"/"
		case it.info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(filepath.Join(root, it.rel))
			if err != nil {
				return nil, err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, it.info.Size()
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(filepath.Join(root, it.rel))
			if err != nil {
				return nil, err
			}
			n, err := io.Copy(tw, io.LimitReader(f, hdr.Size))
			f.Close()
			if err != nil {
				return nil, err
			}
			if n != hdr.Size {
				return nil, fmt.Errorf("pack %s: file changed while packing", it.rel)
			}
			a.Files++
			a.Size += n
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	a.Data = buf.Bytes()
	if int64(len(a.Data)) > MaxArchive {
		return nil, fmt.Errorf("the packed working directory is %s, over the broker's %s limit", human(int64(len(a.Data))), human(MaxArchive))
	}
	a.Hash = Hash(a.Data)
	return a, nil
}

// Hash names an archive.
func Hash(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Unpack extracts a gzip'd tar into dir, refusing absolute names, ".."
// and links that lead outside, and stopping past maxBytes of content.
func Unpack(r io.Reader, dir string, maxBytes int64) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("not a gzip archive: %w", err)
	}
	tr := tar.NewReader(gz)
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean(hdr.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") || name == "." {
			return fmt.Errorf("archive entry %q leaves the directory", hdr.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := noLinkOnPath(dir, name); err != nil {
			return err
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			total += hdr.Size
			if total > maxBytes {
				return fmt.Errorf("archive expands past %s", human(maxBytes))
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_EXCL, mode|0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, io.LimitReader(tr, hdr.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			t := hdr.Linkname
			if path.IsAbs(t) || escapes(path.Join(path.Dir(name), t)) {
				return fmt.Errorf("archive link %s → %s leaves the directory", name, t)
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(t, dst); err != nil {
				return err
			}
		default:
			return fmt.Errorf("archive entry %s: type %c not allowed", name, hdr.Typeflag)
		}
	}
}

func escapes(p string) bool {
	c := path.Clean(p)
	return c == ".." || strings.HasPrefix(c, "../")
}

// noLinkOnPath refuses to write through a symlink the archive made
// earlier.
func noLinkOnPath(dir, name string) error {
	parts := strings.Split(name, "/")
	cur := dir
	for _, p := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, p)
		if fi, err := os.Lstat(cur); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("archive entry %s goes through a link", name)
		}
	}
	return nil
}
