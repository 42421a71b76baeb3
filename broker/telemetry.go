package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Resolution is the width of one telemetry point.
type Resolution string

// Telemetry resolutions and how long each is kept by default.
const (
	Minute Resolution = "m"
	Hour   Resolution = "h"
)

// Width is the time one point covers.
func (r Resolution) Width() time.Duration {
	if r == Hour {
		return time.Hour
	}
	return time.Minute
}

// TelemetryPoint is one GPU's telemetry over one minute or hour. Memory and
// compute are separate series: a card can hold 40 GB while computing
// nothing, and reports must be able to say so.
type TelemetryPoint struct {
	Node  string    `json:"node"`
	GPU   int       `json:"gpu"`
	UUID  string    `json:"uuid,omitempty"`
	Start time.Time `json:"start"`
	// MemoryUsedBytes is the mean memory used over the point's samples;
	// MemoryMaxBytes the largest.
	MemoryUsedBytes int64 `json:"memoryUsedBytes"`
	MemoryMaxBytes  int64 `json:"memoryMaxBytes"`
	// SMUtil is the mean compute utilisation in percent, SMUtilMax the
	// largest sample.
	SMUtil    float64 `json:"smUtil"`
	SMUtilMax int     `json:"smUtilMax"`
	// Samples is how many agent samples the point averages; an hourly
	// point's is the sum over its minutes.
	Samples int `json:"samples"`
}

// telemetryKey orders points by resolution, then time, then node and card,
// so a period is one range scan and retention one prefix delete.
func telemetryKey(r Resolution, start time.Time, node string, gpu int) string {
	return fmt.Sprintf("%s/%012d/%s/%03d", r, start.Unix(), node, gpu)
}

func telemetryBound(r Resolution, t time.Time) string {
	return fmt.Sprintf("%s/%012d/", r, t.Unix())
}

// PutTelemetry writes points.
func PutTelemetry(tx Tx, r Resolution, pts []TelemetryPoint) error {
	for _, p := range pts {
		if err := putJSON(tx, BucketTelemetry, telemetryKey(r, p.Start, p.Node, p.GPU), p); err != nil {
			return err
		}
	}
	return nil
}

// ScanTelemetry calls fn for every point of resolution r starting in
// [from, to), in time order. node == "" means every node.
func ScanTelemetry(tx Tx, r Resolution, from, to time.Time, node string, fn func(TelemetryPoint) error) error {
	return tx.Scan(BucketTelemetry, telemetryBound(r, from), telemetryBound(r, to), func(k string, v []byte) error {
		if node != "" {
			parts := strings.SplitN(k, "/", 4)
			if len(parts) == 4 && parts[2] != node {
				return nil
			}
		}
		var p TelemetryPoint
		if err := json.Unmarshal(v, &p); err != nil {
			return fmt.Errorf("decode telemetry %s: %w", k, err)
		}
		return fn(p)
	})
}

// PruneTelemetry deletes points of resolution r older than before, at most
// limit of them per call (so one transaction stays small); it returns how
// many it deleted. It finds them in a View and deletes them in an Update
// that reads nothing: points that old are written no more, and a Redis
// transaction that read (watched) 20,000 keys would take seconds to
// commit.
func PruneTelemetry(ctx context.Context, st Store, r Resolution, before time.Time, limit int) (int, error) {
	var keys []string
	err := st.View(ctx, func(tx Tx) error {
		return tx.Scan(BucketTelemetry, string(r)+"/", telemetryBound(r, before), func(k string, _ []byte) error {
			keys = append(keys, k)
			if len(keys) >= limit {
				return ErrStopScan
			}
			return nil
		})
	})
	if err != nil || len(keys) == 0 {
		return 0, err
	}
	err = st.Update(ctx, func(tx Tx) error {
		for _, k := range keys {
			if err := tx.Delete(BucketTelemetry, k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(keys), nil
}

// ParseTelemetryKey returns the start of the point a key names.
func ParseTelemetryKey(k string) (Resolution, time.Time, error) {
	parts := strings.SplitN(k, "/", 3)
	if len(parts) < 3 {
		return "", time.Time{}, fmt.Errorf("telemetry key %q", k)
	}
	sec, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("telemetry key %q: %w", k, err)
	}
	return Resolution(parts[0]), time.Unix(sec, 0).UTC(), nil
}
