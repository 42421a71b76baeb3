package server

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/workdir"
)

// limitBody caps every request body and the time to send it. The cap is
// the route's (agent syncs carry logs: maxSyncBytes; uploads are working
// directories: workdir.MaxArchive) or limits.maxBodyBytes;
// a body sent slower than limits.readTimeout is cut off. The deadline is
// lifted once the body is read, so a long poll or a followed log that
// comes after it is not cut (http.Server.ReadTimeout would cut those too).
func (s *Server) limitBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Body == nil || r.Body == http.NoBody {
			return next(c)
		}
		limit := int64(s.cfg().Limits.MaxBodyBytes)
		if strings.HasPrefix(r.URL.Path, "/v1/agent/") || r.URL.Path == agentapi.PathSync || r.URL.Path == agentapi.PathRegister {
			limit = maxSyncBytes
		}
		if strings.HasPrefix(r.URL.Path, "/v1/uploads/") {
			// A packed working directory: putUpload checks it against the
			// archive cap itself.
			limit = workdir.MaxArchive
		}
		if r.ContentLength > limit {
			return newError(http.StatusRequestEntityTooLarge, "too_large", "the request body is %d bytes; this route takes at most %d", r.ContentLength, limit)
		}
		rc := http.NewResponseController(c.Response().Writer)
		if err := rc.SetReadDeadline(time.Now().Add(s.cfg().Limits.ReadTimeout.D())); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		r.Body = &deadlineBody{ReadCloser: http.MaxBytesReader(c.Response().Writer, r.Body, limit), rc: rc}
		return next(c)
	}
}

// deadlineBody lifts the connection's read deadline once the body has been
// read to its end.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
