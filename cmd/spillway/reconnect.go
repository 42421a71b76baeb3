package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/client"
)

// reconnectBackoff paces retries while the broker is away: 500ms doubling
// to 10s, for as long as the user waits.
var reconnectBackoff = struct{ initial, max time.Duration }{500 * time.Millisecond, 10 * time.Second}

// transient reports whether err may pass when the broker is back: a
// network error or a 5xx, not a 4xx (a wrong id, a missing permission).
func transient(err error) bool {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Status >= 500
	}
	return err != nil && !errors.Is(err, context.Canceled)
}

// reconnector says once per outage that the broker went away and waits
// with backoff before the next try.
type reconnector struct {
	w io.Writer
	// meanwhile says what goes on while the CLI is cut off ("job ID
	// keeps running").
	meanwhile string
	backoff   time.Duration
	away      bool
}

// jobReconnector is a reconnector for following one job.
func jobReconnector(w io.Writer, id string) *reconnector {
	return &reconnector{w: w, meanwhile: "job " + id + " keeps running"}
}

// wait reports the outage (first time only) and sleeps; it returns the
// context's error when the user gives up.
func (r *reconnector) wait(ctx context.Context, err error) error {
	r.backoff = min(max(2*r.backoff, reconnectBackoff.initial), reconnectBackoff.max)
	if !r.away {
		r.away = true
		fmt.Fprintf(r.w, "spillway: lost the broker (%v); reconnecting, %s\n", err, r.meanwhile)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.backoff):
		return nil
	}
}

// ok notes a successful call after an outage.
func (r *reconnector) ok() {
	if r.away {
		fmt.Fprintln(r.w, "spillway: reconnected")
	}
	r.away, r.backoff = false, 0
}

// jobRetrying reads a job, retrying through broker restarts.
func jobRetrying(ctx context.Context, c *client.Client, id string, r *reconnector) (*broker.Job, error) {
	return retrying(ctx, r, func() (*broker.Job, error) { return c.Job(ctx, id) })
}

// arrayRetrying reads an array at a glance, retrying through broker
// restarts.
func arrayRetrying(ctx context.Context, c *client.Client, id string, r *reconnector) (*api.ArrayView, error) {
	return retrying(ctx, r, func() (*api.ArrayView, error) { return c.Array(ctx, id) })
}

// retrying calls get until it answers or fails for good (not transient),
// waiting out the broker's absences with r.
func retrying[T any](ctx context.Context, r *reconnector, get func() (T, error)) (T, error) {
	for {
		v, err := get()
		if err == nil {
			r.ok()
			return v, nil
		}
		if ctx.Err() != nil || !transient(err) {
			return v, err
		}
		if werr := r.wait(ctx, err); werr != nil {
			return v, werr
		}
	}
}

// skipWriter drops the first skip bytes (already shown before a
// reconnect) and counts everything it was given.
type skipWriter struct {
	w    io.Writer
	skip int64
	seen int64
}

func (s *skipWriter) Write(p []byte) (int, error) {
	n := len(p)
	start := max(min(s.skip-s.seen, int64(n)), 0)
	s.seen += int64(n)
	if start < int64(n) {
		if _, err := s.w.Write(p[start:]); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// followLogs follows a job's log to w until the job ends, reconnecting
// through broker restarts without repeating what was shown: each
// reconnect reads the log from the start and skips the bytes already
// written. A stream that ends while the job is still active (a broker
// that shut down cleanly) is a reconnect too.
func followLogs(ctx context.Context, c *client.Client, id string, o client.LogOptions, w io.Writer, r *reconnector) error {
	var shown int64 // bytes of the whole log written, when o.Tail < 0
	first := true
	for {
		opts := o
		opts.Follow = true
		sw := &skipWriter{w: w}
		switch {
		case o.Tail < 0:
			sw.skip = shown
		case !first:
			// The first stream was a tail: from now on only what is new.
			opts.Tail = 0
		}
		err := c.Logs(ctx, id, opts, sw)
		shown = max(shown, sw.seen)
		first = false
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !transient(err) {
			return err
		}
		if err == nil {
			j, jerr := jobRetrying(ctx, c, id, r)
			if jerr != nil {
				return jerr
			}
			if j.State.Terminal() {
				r.ok()
				return nil
			}
			err = errors.New("log stream ended early")
		}
		if werr := r.wait(ctx, err); werr != nil {
			return werr
		}
	}
}
