package staging

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/onprem/staging/location"
)

// Checkpoint layout under checkpoint.to (a prefix):
//
//	<prefix><seq>/<file>            the files of one checkpoint
//	<prefix><seq>.manifest.json     its manifest, written last
//
// A checkpoint exists only once its manifest does: an upload cut short
// leaves files without a manifest, which restore ignores (and the next
// sync's pruning removes). seq is 20 zero-padded digits, so the newest
// sorts last.

// Manifest commits one checkpoint: every file with its size and SHA-256.
type Manifest struct {
	Seq       string         `json:"seq"`
	Job       string         `json:"job,omitempty"`
	Attempt   int            `json:"attempt,omitempty"`
	CreatedAt time.Time      `json:"createdAt"`
	Files     []ManifestFile `json:"files"`
}

// ManifestFile is one file of a checkpoint.
type ManifestFile struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

var manifestRe = regexp.MustCompile(`^(\d{20})\.manifest\.json$`)

// CheckpointMeta names the attempt a checkpoint comes from.
type CheckpointMeta struct {
	Job     string
	Attempt int
	// Seq orders checkpoints; zero: the current time in nanoseconds.
	Seq int64
}

// SyncCheckpoint uploads dir as a new checkpoint under to, commits it with
// its manifest and keeps the newest keep committed ones (keep < 1: 1). An
// empty or missing dir uploads nothing and returns ok false.
func (st *Stager) SyncCheckpoint(ctx context.Context, dir, to string, keep int, meta CheckpointMeta) (*Manifest, error) {
	u, err := location.Parse(to)
	if err != nil {
		return nil, fmt.Errorf("checkpoint.to %s %w", to, err)
	}
	s, err := st.store(u)
	if err != nil {
		return nil, err
	}
	seq := meta.Seq
	if seq == 0 {
		seq = time.Now().UnixNano()
	}
	m := &Manifest{Seq: fmt.Sprintf("%020d", seq), Job: meta.Job, Attempt: meta.Attempt, CreatedAt: time.Now().UTC()}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && p == dir {
				return filepath.SkipAll
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		sum, size, err := fileDigest(p)
		if err != nil {
			return err
		}
		m.Files = append(m.Files, ManifestFile{Path: filepath.ToSlash(rel), Size: size, SHA256: sum})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	if len(m.Files) == 0 {
		return nil, nil
	}
	base := u.Prefix() + m.Seq + "/"
	for _, f := range m.Files {
		if _, err := st.putRetry(ctx, s, u, base+f.Path, filepath.Join(dir, filepath.FromSlash(f.Path))); err != nil {
			return nil, err
		}
	}
	body, _ := json.MarshalIndent(m, "", "  ")
	if err := st.putBytes(ctx, s, u, u.Prefix()+m.Seq+".manifest.json", body); err != nil {
		return nil, err
	}
	st.prune(ctx, s, u, max(keep, 1))
	return m, nil
}

func (st *Stager) putBytes(ctx context.Context, s Store, u location.URI, key string, body []byte) error {
	tmp, err := os.CreateTemp(st.cache.dir, "manifest-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(body); err != nil {
		tmp.Close()
		return err
	}
	tmp.Close()
	_, err = st.putRetry(ctx, s, u, key, tmp.Name())
	return err
}

// committed lists the committed checkpoints under u, oldest first, and
// every seq that has files (committed or not).
func committed(ctx context.Context, s Store, u location.URI) ([]string, map[string][]string, error) {
	objs, err := s.List(ctx, u.Bucket, u.Prefix())
	if errors.Is(err, ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var seqs []string
	files := map[string][]string{}
	for _, o := range objs {
		rel := strings.TrimPrefix(o.Key, u.Prefix())
		if m := manifestRe.FindStringSubmatch(rel); m != nil {
			seqs = append(seqs, m[1])
			continue
		}
		if i := strings.IndexByte(rel, '/'); i == 20 {
			files[rel[:20]] = append(files[rel[:20]], o.Key)
		}
	}
	sort.Strings(seqs)
	return seqs, files, nil
}

// prune deletes committed checkpoints beyond the newest keep, and
// uncommitted files older than the newest committed checkpoint. Failures
// are left for the next sync.
func (st *Stager) prune(ctx context.Context, s Store, u location.URI, keep int) {
	seqs, files, err := committed(ctx, s, u)
	if err != nil || len(seqs) == 0 {
		return
	}
	newest := seqs[len(seqs)-1]
	live := map[string]bool{}
	if len(seqs) > keep {
		for _, seq := range seqs[:len(seqs)-keep] {
			_ = s.Delete(ctx, u.Bucket, []string{u.Prefix() + seq + ".manifest.json"})
		}
		seqs = seqs[len(seqs)-keep:]
	}
	for _, seq := range seqs {
		live[seq] = true
	}
	for seq, keys := range files {
		if !live[seq] && seq < newest {
			_ = s.Delete(ctx, u.Bucket, keys)
		}
	}
}

// RestoreCheckpoint fills dir with the newest committed checkpoint under
// from whose files all match their manifest. It returns nil, nil when there
// is none. Files are written beside dir first and moved in only when the
// whole checkpoint arrived, so dir never holds half a checkpoint.
func (st *Stager) RestoreCheckpoint(ctx context.Context, dir, from string, progress func(Progress)) (*Manifest, error) {
	u, err := location.Parse(from)
	if err != nil {
		return nil, fmt.Errorf("checkpoint.to %s %w", from, err)
	}
	s, err := st.store(u)
	if err != nil {
		return nil, err
	}
	seqs, _, err := committed(ctx, s, u)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints at %s: %w", from, err)
	}
	for i := len(seqs) - 1; i >= 0; i-- {
		m, err := st.restoreOne(ctx, s, u, seqs[i], dir, progress)
		if err == nil {
			return m, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, nil
}

func (st *Stager) restoreOne(ctx context.Context, s Store, u location.URI, seq, dir string, progress func(Progress)) (*Manifest, error) {
	rc, err := s.Get(ctx, u.Bucket, u.Prefix()+seq+".manifest.json")
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(rc, 16<<20))
	rc.Close()
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil || m.Seq != seq {
		return nil, fmt.Errorf("manifest %s is malformed", seq)
	}
	var total int64
	for _, f := range m.Files {
		total += f.Size
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(dir)), 0o750); err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp(filepath.Dir(filepath.Clean(dir)), ".spillway-restore-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	var done int64
	for _, f := range m.Files {
		dest := filepath.Join(stage, filepath.FromSlash(f.Path))
		if !strings.HasPrefix(dest, stage+string(filepath.Separator)) {
			return nil, fmt.Errorf("manifest %s: path %q escapes the checkpoint dir", seq, f.Path)
		}
		if err := os.MkdirAll(filepath.Dir(dest), 0o750); err != nil {
			return nil, err
		}
		body, err := s.Get(ctx, u.Bucket, u.Prefix()+seq+"/"+f.Path)
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		err = writeFile(dest, io.TeeReader(body, h))
		body.Close()
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(dest)
		if err != nil {
			return nil, err
		}
		if fi.Size() != f.Size || hex.EncodeToString(h.Sum(nil)) != f.SHA256 {
			return nil, fmt.Errorf("checkpoint %s: %s does not match its manifest", seq, f.Path)
		}
		done += f.Size
		if progress != nil {
			progress(Progress{Phase: "restore", Done: done, Total: total})
		}
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(stage, dir); err != nil {
		return nil, err
	}
	return &m, nil
}

func fileDigest(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}
