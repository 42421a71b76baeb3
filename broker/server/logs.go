package server

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
)

// logPoll is how often a followed log checks the store for new bytes.
const logPoll = 200 * time.Millisecond

// maxTailBytes bounds how far back ?tail=N looks for N lines.
const maxTailBytes = 1 << 20

// logs serves an attempt's log: all of it, its last N lines (?tail=N), and
// with ?follow=true everything that arrives until the job ends, across
// retries and resumptions (each new attempt starts with a marker line).
func (s *Server) logs(c echo.Context) error {
	j, err := s.loadVisibleJob(c)
	if err != nil {
		return err
	}
	follow, _ := strconv.ParseBool(c.QueryParam("follow"))
	attempt := j.Attempt
	if a := c.QueryParam("attempt"); a != "" {
		n, err := strconv.Atoi(a)
		if err != nil || n < 1 || n > j.Attempt {
			return errBadRequest("attempt", broker.CodeOutOfRange, "must be between 1 and %d", max(j.Attempt, 1))
		}
		attempt = n
		follow = false
	}
	tail := -1
	if t := c.QueryParam("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 || n > 100000 {
			return errBadRequest("tail", broker.CodeOutOfRange, "must be between 0 and 100000 lines")
		}
		tail = n
	}
	ctx := c.Request().Context()
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)

	var off int64
	if tail >= 0 && attempt > 0 {
		var size int64
		if err := s.store.View(ctx, func(tx broker.Tx) error {
			m, err := broker.GetLogMeta(tx, j.ID, attempt)
			size = m.Size
			return err
		}); err != nil {
			return err
		}
		off = max(0, size-maxTailBytes)
		var buf []byte
		if err := s.store.View(ctx, func(tx broker.Tx) error {
			var err error
			buf, err = broker.ReadLog(tx, j.ID, attempt, off, maxTailBytes)
			return err
		}); err != nil {
			return err
		}
		cut := broker.LastLines(buf, tail)
		off += int64(len(buf) - len(cut))
	}
	for {
		if attempt > 0 {
			for {
				var chunk []byte
				if err := s.store.View(ctx, func(tx broker.Tx) error {
					var err error
					chunk, err = broker.ReadLog(tx, j.ID, attempt, off, 256<<10)
					return err
				}); err != nil {
					return err
				}
				if len(chunk) == 0 {
					break
				}
				if _, err := w.Write(chunk); err != nil {
					return nil // the client went away
				}
				off += int64(len(chunk))
			}
			w.Flush()
		}
		if !follow {
			return nil
		}
		// Re-read the job: has it ended, or moved to a new attempt?
		var cur *broker.Job
		if err := s.store.View(ctx, func(tx broker.Tx) error {
			var err error
			cur, err = broker.GetJob(tx, j.ID)
			return err
		}); err != nil {
			return err
		}
		if cur.Attempt != attempt {
			// Drain the old attempt first: its last bytes may have landed
			// together with its end.
			var rest []byte
			_ = s.store.View(ctx, func(tx broker.Tx) error {
				var err error
				rest, err = broker.ReadLog(tx, j.ID, attempt, off, 1<<30)
				return err
			})
			if len(rest) > 0 {
				off += int64(len(rest))
				_, _ = w.Write(rest)
				continue
			}
			attempt, off = cur.Attempt, 0
			fmt.Fprintf(w, "--- spillway: attempt %d %s ---\n", attempt, broker.DescribePlacements(cur.Placements))
			w.Flush()
			continue
		}
		if cur.State.Terminal() {
			// One last read: the final bytes were stored with the end.
			var rest []byte
			_ = s.store.View(ctx, func(tx broker.Tx) error {
				var err error
				rest, err = broker.ReadLog(tx, j.ID, attempt, off, 1<<30)
				return err
			})
			_, _ = w.Write(rest)
			w.Flush()
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPoll):
		}
	}
}
