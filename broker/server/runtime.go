package server

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/onprem/workdir"
)

// addRuntimeFields copies what the node's runtime needs from the spec:
// the user it maps to a uid, the image, mounts, limits and the upload.
func (s *Server) addRuntimeFields(j *broker.Job, a *agentapi.Assignment) {
	a.User = j.Spec.User
	if a.User == "" {
		a.User = j.User
	}
	a.Image = j.Spec.Image
	a.Memory = int64(j.Spec.Resources.Memory)
	a.ShmSize = int64(j.Spec.ShmSize)
	a.WorkdirUpload = j.Spec.WorkdirUpload
	for _, m := range j.Spec.Mounts {
		a.Mounts = append(a.Mounts, agentapi.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
}

// noteProgress records what a starting attempt waits for (an image pull)
// and reports whether the attempt is still preparing; the job stays
// starting until its agent reports it without progress.
func (s *Server) noteProgress(j *broker.Job, r agentapi.JobReport) bool {
	if r.Progress == "" {
		s.progress.Delete(j.ID)
		return false
	}
	if j.State != broker.StateStarting {
		return false
	}
	s.progress.Store(j.ID, clipProgress(r.Progress))
	return true
}

func clipProgress(p string) string {
	p = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, p)
	if len(p) > 120 {
		p = p[:120]
	}
	return p
}

// overlayProgress fills a starting job's progress from memory.
func (s *Server) overlayProgress(j *broker.Job) {
	if j.State != broker.StateStarting {
		return
	}
	if p, ok := s.progress.Load(j.ID); ok {
		j.Progress = p.(string)
	}
}

var uploadHashRe = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

// uploadPath is where the broker keeps an uploaded workdir archive.
func (s *Server) uploadPath(hash string) (string, error) {
	if !uploadHashRe.MatchString(hash) {
		return "", newError(http.StatusBadRequest, broker.CodeInvalid, "upload hash must be sha256:<64 hex digits>")
	}
	return filepath.Join(s.cfg().DataDir, "uploads", strings.TrimPrefix(hash, "sha256:")+".tar.gz"), nil
}

// checkUpload refuses a spec naming an archive the broker does not hold.
func (s *Server) checkUpload(hash string) error {
	if hash == "" {
		return nil
	}
	p, err := s.uploadPath(hash)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); err != nil {
		return &broker.ValidationError{Errors: []broker.FieldError{{Field: "workdirUpload", Code: broker.CodeInvalid,
			Message: fmt.Sprintf("%s was not uploaded: PUT /v1/uploads/%s first (spillway run does)", hash, hash)}}}
	}
	return nil
}

// hasUpload answers 200 when the broker holds the archive, so that the
// CLI uploads an unchanged directory only once.
func (s *Server) hasUpload(c echo.Context) error {
	p, err := s.uploadPath(c.Param("hash"))
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); err != nil {
		return c.NoContent(http.StatusNotFound)
	}
	return c.NoContent(http.StatusOK)
}

// putUpload stores a workdir archive under its content hash, checked
// against the body.
func (s *Server) putUpload(c echo.Context) error {
	hash := c.Param("hash")
	p, err := s.uploadPath(hash)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); err == nil {
		return c.JSON(http.StatusOK, map[string]string{"hash": hash})
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), "put-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(c.Request().Body, workdir.MaxArchive+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	if n > workdir.MaxArchive {
		return newError(http.StatusRequestEntityTooLarge, broker.CodeTooLarge, "the archive is over the %d-byte limit", workdir.MaxArchive)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != hash {
		return newError(http.StatusBadRequest, broker.CodeInvalid, "the body's hash is %s, not %s", got, hash)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, map[string]string{"hash": hash})
}

// getUpload hands an archive to an agent.
func (s *Server) getUpload(c echo.Context) error {
	p, err := s.uploadPath(c.Param("hash"))
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return newError(http.StatusNotFound, "not_found", "upload %s not found", c.Param("hash"))
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return c.Stream(http.StatusOK, "application/gzip", f)
}

// burstRuntime is the runtime a burst machine's agent gets: the one the
// operator configured for its provider, plus the queue's most-used images
// to pull while the machine comes up (oci only).
func (s *Server) burstRuntime(provider string) *jobrt.Config {
	rt := s.adapt().RuntimeFor(provider)
	if rt.Kind == jobrt.KindOCI {
		rt.PrePull = s.topImages(cmp.Or(s.cfg().Burst.PrePullImages, 3))
	}
	return &rt
}

// topImages are the n images most waiting and running jobs name, most
// first (ties by name).
func (s *Server) topImages(n int) []string {
	s.lock()
	count := map[string]int{}
	for j := range s.view.Jobs() {
		if j.Spec.Image != "" && !j.State.Terminal() {
			count[j.Spec.Image]++
		}
	}
	s.mu.Unlock()
	images := make([]string, 0, len(count))
	for img := range count {
		images = append(images, img)
	}
	slices.SortFunc(images, func(a, b string) int {
		if c := count[b] - count[a]; c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return images[:min(n, len(images))]
}
