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

// JobData is what the agent reported of the staging of a job's current
// attempt. It is replaced, never changed in place, so clones may share it.
type JobData struct {
	Attempt int `json:"attempt"`
	// Phase is restore | inputs | running | checkpoint | outputs | done.
	Phase string `json:"phase"`
	// Done and Total are the bytes of the phase.
	Done  int64 `json:"done,omitempty"`
	Total int64 `json:"total,omitempty"`
	// Spans are the stretches spent staging (metered as staging).
	Spans []DataSpan `json:"spans,omitempty"`
	// Restored is the checkpoint the attempt started from.
	Restored string `json:"restored,omitempty"`
	// Checkpoint is the newest checkpoint the attempt committed.
	Checkpoint   string     `json:"checkpoint,omitempty"`
	CheckpointAt *time.Time `json:"checkpointAt,omitempty"`
	// InputBytes and CacheHitBytes: the inputs and the part the node's
	// cache held.
	InputBytes    int64  `json:"inputBytes,omitempty"`
	CacheHitBytes int64  `json:"cacheHitBytes,omitempty"`
	Error         string `json:"error,omitempty"`
}

// DataSpan is a stretch of staging time; an open one has no End.
type DataSpan struct {
	Start time.Time  `json:"start"`
	End   *time.Time `json:"end,omitempty"`
}

// DataWait says a job's GPUs wait on its data: compute stayed low while
// the job read from storage.
type DataWait struct {
	Since time.Time `json:"since"`
	Last  time.Time `json:"last"`
	// ReadBytesPerSec and SMUtil are the latest readings.
	ReadBytesPerSec int64 `json:"readBytesPerSec"`
	SMUtil          int   `json:"smUtil"`
	// Active is false once the job computes again (kept for reports).
	Active bool `json:"active"`
}

// NodeCache is a node's input cache, as its agent reports it.
type NodeCache struct {
	Bytes     int64 `json:"bytes"`
	CapBytes  int64 `json:"capBytes"`
	Objects   int   `json:"objects"`
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Evictions int64 `json:"evictions"`
	// HitRatio is hits over lookups.
	HitRatio float64 `json:"hitRatio"`
}

// CheckBucket checks one entry of a team's allow-list (SpecLimits.Buckets,
// the config's teams[].buckets): "*" or an object-store location that
// validateData can match job locations against.
func CheckBucket(pattern string) error {
	if pattern == "*" {
		return nil
	}
	_, err := location.Parse(pattern)
	return err
}
