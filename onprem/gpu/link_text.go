package gpu

import (
	"fmt"
	"strings"
)

// MarshalText writes the nvidia-smi spelling ("NV", "PIX", ...). Without
// it encoding/json would write a row of the topology matrix, a []Link of
// bytes, as a base64 string.
func (l Link) MarshalText() ([]byte, error) {
	if l > LinkSys {
		return nil, fmt.Errorf("link level %d out of range", uint8(l))
	}
	return []byte(l.String()), nil
}

// UnmarshalText reads the nvidia-smi spelling; "NV18" (NVLink with a link
// count, as nvidia-smi topo -m prints it) reads as LinkNVLink.
func (l *Link) UnmarshalText(b []byte) error {
	s := strings.ToUpper(string(b))
	for c := LinkSelf; c <= LinkSys; c++ {
		if s == c.String() {
			*l = c
			return nil
		}
	}
	if strings.HasPrefix(s, "NV") {
		*l = LinkNVLink
		return nil
	}
	return fmt.Errorf("link level %q: want X, NV, PIX, PXB, PHB, NODE or SYS", string(b))
}
