package server

import (
	"net/http"
	"strings"

	"github.com/spillway-dev/spillway/broker"
)

// MinIDPrefix is the shortest id prefix the API resolves, as git resolves
// a short commit hash: any unique prefix of at least this many characters
// names a job (or a burst machine) wherever a full id is accepted.
const MinIDPrefix = 4

// resolveJobPrefix finds the one job the caller may see whose id starts
// with prefix (case-insensitive). None is ErrNotFound; more than one is a
// 409 naming a few.
func resolveJobPrefix(tx broker.Tx, prefix string, visible func(*broker.Job) bool) (*broker.Job, error) {
	prefix = strings.ToUpper(prefix)
	if len(prefix) < MinIDPrefix {
		return nil, broker.ErrNotFound
	}
	var found []*broker.Job
	err := tx.Scan(broker.BucketJobs, prefix, broker.PrefixEnd(prefix), func(id string, _ []byte) error {
		j, err := broker.GetJob(tx, id)
		if err != nil {
			return err
		}
		if visible(j) {
			found = append(found, j)
		}
		if len(found) > 3 {
			return broker.ErrStopScan
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch len(found) {
	case 0:
		return nil, broker.ErrNotFound
	case 1:
		return found[0], nil
	}
	ids := make([]string, 0, 3)
	for _, j := range found[:min(3, len(found))] {
		ids = append(ids, j.ID)
	}
	more := ""
	if len(found) > 3 {
		more = ", …"
	}
	return nil, newError(http.StatusConflict, "ambiguous", "job id prefix %s is ambiguous: %s%s; give more characters", clip(prefix), strings.Join(ids, ", "), more)
}

// matchInstancePrefix picks the one record id in ids starting with prefix.
func matchInstancePrefix(ids []string, prefix string) (string, error) {
	prefix = strings.ToLower(prefix)
	var found []string
	for _, id := range ids {
		if strings.HasPrefix(id, prefix) || strings.HasPrefix(strings.TrimPrefix(id, "spw-"), prefix) {
			found = append(found, id)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1 && len(prefix) >= MinIDPrefix:
		return "", newError(http.StatusConflict, "ambiguous", "machine id prefix %s is ambiguous: %s; give more characters", clip(prefix), strings.Join(found[:min(3, len(found))], ", "))
	}
	return "", broker.ErrNotFound
}
