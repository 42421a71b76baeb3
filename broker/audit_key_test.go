package broker

import (
	"fmt"
	"testing"
	"time"
)

// auditKey is the key fmt's "%020d/%s" made, so records keep their order
// and old keys their meaning.
func TestAuditKeyMatchesTheFormat(t *testing.T) {
	for _, at := range []time.Time{time.Unix(0, 0), time.Unix(0, 7), time.Date(2026, 12, 1, 22, 40, 1, 123456789, time.UTC),
		time.Date(2262, 4, 11, 0, 0, 0, 0, time.UTC), time.Unix(-5, 0)} {
		want := fmt.Sprintf("%020d/%s", at.UnixNano(), "r1")
		if got := auditKey(at, "r1"); got != want {
			t.Errorf("auditKey(%v) = %q, want %q", at, got, want)
		}
	}
}
