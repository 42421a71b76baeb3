package broker

import (
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/onprem/staging/location"
)

// Data fields of a spec: inputs, outputs and a checkpoint that travels.
// docs/data.md is the user's guide.

// Input is an object or prefix the agent fetches before the job starts.
type Input struct {
	// From is s3://bucket/key-or-prefix, gs://bucket/… or https://….
	From string `json:"from"`
	// To is a path, relative to the job's working directory or absolute.
	To string `json:"to"`
	// Cache false skips the node's input cache (default true).
	Cache *bool `json:"cache,omitempty"`
}

// Output is a file or directory uploaded after the job ends.
type Output struct {
	From string `json:"from"`
	// To is s3://bucket/key-or-prefix or gs://….
	To string `json:"to"`
	// When is always (default) or success.
	When string `json:"when,omitempty"`
}

// Bounds on the data fields.
const (
	maxDataItems     = 64
	defaultKeep      = 3
	maxKeep          = 100
	minCkptInterval  = time.Minute
	maxCkptInterval  = 7 * 24 * time.Hour
	outputWhenAlways = "always"
	outputWhenOK     = "success"
)

// HasData reports whether the agent has anything to stage for the job.
func (s *Spec) HasData() bool {
	return len(s.Inputs) > 0 || len(s.Outputs) > 0 || s.Checkpoint.To != ""
}

func (s *Spec) normalizeData() {
	for i := range s.Outputs {
		if s.Outputs[i].When == "" {
			s.Outputs[i].When = outputWhenAlways
		}
	}
	if s.Checkpoint.To != "" && s.Checkpoint.Keep == 0 {
		s.Checkpoint.Keep = defaultKeep
	}
}

// validateData checks inputs, outputs and checkpoint.dir|to|keep|interval,
// and that every location is one the team may use.
func (s *Spec) validateData(ve *ValidationError, lim SpecLimits) {
	allowed := lim.Buckets[s.Team]
	loc := func(field, v string, writable bool) {
		switch {
		case v == "":
			ve.add(field, CodeRequired, "is required")
			return
		case len(v) > maxPathLen:
			ve.add(field, CodeTooLong, "is longer than %d bytes", maxPathLen)
			return
		}
		u, err := location.Parse(v)
		if err != nil {
			ve.add(field, CodeInvalid, "%s", err.Error())
			return
		}
		if writable && u.Scheme == location.SchemeHTTPS {
			ve.add(field, CodeInvalid, "must be s3:// or gs:// (https:// locations are read-only)")
			return
		}
		if !u.Allowed(allowed) {
			if len(allowed) == 0 {
				ve.add(field, CodeNotAllowed, "team %s may use no object storage; an operator lists its buckets under teams[].buckets", clip(s.Team))
			} else {
				ve.add(field, CodeNotAllowed, "%s is outside the locations team %s may use (%s)", clip(v), clip(s.Team), strings.Join(allowed, ", "))
			}
		}
	}
	localPath := func(field, v string) {
		switch {
		case v == "":
			ve.add(field, CodeRequired, "is required")
		case len(v) > maxPathLen:
			ve.add(field, CodeTooLong, "is longer than %d bytes", maxPathLen)
		case strings.IndexByte(v, 0) >= 0:
			ve.add(field, CodeInvalid, "must not contain NUL bytes")
		case strings.Contains("/"+v+"/", "/../"):
			ve.add(field, CodeInvalid, "must not contain '..' segments")
		case path.Clean(v) == "/":
			ve.add(field, CodeInvalid, "must not be /")
		}
	}
	if len(s.Inputs) > maxDataItems {
		ve.add("inputs", CodeTooLong, "has %d entries; the limit is %d", len(s.Inputs), maxDataItems)
	} else {
		for i, in := range s.Inputs {
			loc(fmt.Sprintf("inputs[%d].from", i), in.From, false)
			localPath(fmt.Sprintf("inputs[%d].to", i), in.To)
		}
	}
	if len(s.Outputs) > maxDataItems {
		ve.add("outputs", CodeTooLong, "has %d entries; the limit is %d", len(s.Outputs), maxDataItems)
	} else {
		for i, out := range s.Outputs {
			localPath(fmt.Sprintf("outputs[%d].from", i), out.From)
			loc(fmt.Sprintf("outputs[%d].to", i), out.To, true)
			if out.When != outputWhenAlways && out.When != outputWhenOK {
				ve.add(fmt.Sprintf("outputs[%d].when", i), CodeInvalid, "must be always or success, got %q", clip(out.When))
			}
		}
	}
	c := s.Checkpoint
	if c.Dir != "" {
		localPath("checkpoint.dir", c.Dir)
	}
	if c.To != "" {
		if c.Dir == "" {
			ve.add("checkpoint.dir", CodeRequired, "is required with checkpoint.to: the directory the job writes its checkpoint to")
		}
		loc("checkpoint.to", c.To, true)
	}
	switch {
	case c.Keep < 0 || c.Keep > maxKeep:
		ve.add("checkpoint.keep", CodeOutOfRange, "must be between 1 and %d, got %d", maxKeep, c.Keep)
	case c.Keep > 0 && c.To == "":
		ve.add("checkpoint.keep", CodeNotAllowed, "needs checkpoint.to")
	}
	switch {
	case c.Interval == 0:
	case c.To == "":
		ve.add("checkpoint.interval", CodeNotAllowed, "needs checkpoint.to")
	case c.Interval.D() < minCkptInterval || c.Interval.D() > maxCkptInterval:
		ve.add("checkpoint.interval", CodeOutOfRange, "must be between 1m and 168h, got %s", c.Interval)
	}
}
