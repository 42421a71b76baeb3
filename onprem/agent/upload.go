package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/workdir"
)

// unpackUpload fetches the uploaded workdir archive named by its content
// hash (once per node: archives are kept in the data dir by hash) and
// unpacks it into dir.
func (ag *Agent) unpackUpload(hash, dir string) error {
	path, err := ag.fetchUpload(hash)
	if err != nil {
		return fmt.Errorf("fetch workdir %s: %w", hash, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := workdir.Unpack(f, dir, workdir.MaxUnpacked); err != nil {
		return fmt.Errorf("unpack workdir %s: %w", hash, err)
	}
	return nil
}

// fetchUpload returns the local copy of an archive, downloading and
// checking it against its hash when the node does not have it yet.
func (ag *Agent) fetchUpload(hash string) (string, error) {
	hexDigest, ok := strings.CutPrefix(hash, "sha256:")
	if !ok || len(hexDigest) != 64 {
		return "", errors.New("not a sha256 hash")
	}
	if _, err := hex.DecodeString(hexDigest); err != nil {
		return "", errors.New("not a sha256 hash")
	}
	dir := filepath.Join(ag.cfg.DataDir, "uploads")
	path := filepath.Join(dir, hexDigest+".tar.gz")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(ag.cfg.Broker, "/")+agentapi.PathUploads+hash, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+ag.cfg.Token)
	resp, err := ag.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("broker answered %d", resp.StatusCode)
	}
	tmp, err := os.CreateTemp(dir, "fetch-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, workdir.MaxArchive+1)); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hexDigest {
		return "", fmt.Errorf("archive does not match its hash (got sha256:%s)", got)
	}
	return path, os.Rename(tmp.Name(), path)
}

// forget removes what the runtime kept of an acknowledged attempt and its
// local log.
func (ag *Agent) forget(ref agentapi.JobRef) {
	id := attemptID(ref)
	ag.rt.Forget(id)
	_ = os.Remove(filepath.Join(ag.cfg.DataDir, "logs", id+".log"))
}
