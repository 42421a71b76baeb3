package broker

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration written as "90s", "2m", "4h", "1h30m" or "2d"
// in specs and config, and printed the same short way.
type Duration time.Duration

// D returns the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String prints the shortest form: "4h", "1h30m", "90s" prints as "1m30s".
func (d Duration) String() string { return FormatDuration(time.Duration(d)) }

// FormatDuration prints d without zero units ("4h", "2m30s", "150ms").
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	neg := d < 0
	if neg {
		d = -d
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	if d < time.Second {
		b.WriteString(d.String())
		return b.String()
	}
	if days := d / (24 * time.Hour); days > 0 && d%(24*time.Hour) == 0 {
		fmt.Fprintf(&b, "%dd", days)
		return b.String()
	}
	h := d / time.Hour
	m := (d % time.Hour) / time.Minute
	s := (d % time.Minute) / time.Second
	rest := d % time.Second
	if h > 0 {
		fmt.Fprintf(&b, "%dh", h)
	}
	if m > 0 {
		fmt.Fprintf(&b, "%dm", m)
	}
	if s > 0 || rest > 0 {
		if rest > 0 {
			fmt.Fprintf(&b, "%gs", float64(s)+rest.Seconds())
		} else {
			fmt.Fprintf(&b, "%ds", s)
		}
	}
	return b.String()
}

// ParseDuration accepts Go durations ("1h30m", "90s") and whole days ("2d").
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	if strings.HasSuffix(s, "d") {
		n, err := strconv.ParseInt(strings.TrimSuffix(s, "d"), 10, 64)
		if err != nil || n < 0 || n > 3650 {
			return 0, fmt.Errorf("%q is not a duration like 90s, 2h or 3d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration like 90s, 2h or 3d", s)
	}
	return d, nil
}

// MarshalJSON writes the short string form.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return d.decodeSpec(v)
}

// decodeSpec is the spec decoder's hook (see decode.go).
func (d *Duration) decodeSpec(v any) error {
	switch x := v.(type) {
	case string:
		p, err := ParseDuration(x)
		if err != nil {
			return err
		}
		*d = Duration(p)
	case json.Number:
		f, err := x.Float64()
		if err != nil || f < 0 || f > float64(math.MaxInt64/int64(time.Second)) {
			return fmt.Errorf("%s is not a number of seconds", x)
		}
		*d = Duration(time.Duration(f * float64(time.Second)))
	case float64:
		if x < 0 || x > float64(math.MaxInt64/int64(time.Second)) {
			return fmt.Errorf("%v is not a number of seconds", x)
		}
		*d = Duration(time.Duration(x * float64(time.Second)))
	default:
		return fmt.Errorf("must be a duration like \"4h\"")
	}
	return nil
}

// MarshalText lets config files use the same form.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Quantity is an amount of bytes written like Kubernetes quantities: "16Gi",
// "512Mi", "80G", or a plain number of bytes.
type Quantity int64

// Binary and decimal multipliers accepted by ParseQuantity.
var quantitySuffixes = []struct {
	s string
	m int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}

// ParseQuantity reads "16Gi", "1.5Gi", "80G", "1024".
func ParseQuantity(s string) (int64, error) {
	s = strings.TrimSpace(s)
	orig := s
	mult := int64(1)
	if n := len(s); n >= 2 && s[n-1] == 'B' && strings.ContainsRune("KMGTP", rune(s[n-2])) {
		s = s[:n-1] // tolerate "80GB" style
	}
	for _, q := range quantitySuffixes {
		if strings.HasSuffix(s, q.s) {
			mult = q.m
			s = strings.TrimSuffix(s, q.s)
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, fmt.Errorf("%q is not a size like 16Gi or 512Mi", orig)
	}
	v := f * float64(mult)
	if v > float64(math.MaxInt64/2) {
		return 0, fmt.Errorf("%q is too large", orig)
	}
	return int64(v), nil
}

// FormatQuantity prints bytes in the largest binary unit that divides them.
func FormatQuantity(b int64) string {
	units := []struct {
		s string
		m int64
	}{{"Pi", 1 << 50}, {"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}}
	for _, u := range units {
		if b >= u.m && b%u.m == 0 {
			return fmt.Sprintf("%d%s", b/u.m, u.s)
		}
	}
	return strconv.FormatInt(b, 10)
}

// String prints the quantity like "16Gi".
func (q Quantity) String() string { return FormatQuantity(int64(q)) }

// MarshalJSON writes the quantity as a string like "16Gi".
func (q Quantity) MarshalJSON() ([]byte, error) { return json.Marshal(q.String()) }

// UnmarshalJSON reads a quantity string or a number of bytes.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	var v any
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return err
	}
	return q.decodeSpec(v)
}

func (q *Quantity) decodeSpec(v any) error {
	switch x := v.(type) {
	case string:
		n, err := ParseQuantity(x)
		if err != nil {
			return err
		}
		*q = Quantity(n)
	case json.Number:
		n, err := ParseQuantity(x.String())
		if err != nil {
			return err
		}
		*q = Quantity(n)
	case float64:
		if x < 0 || x > float64(math.MaxInt64/2) {
			return fmt.Errorf("%v is out of range", x)
		}
		*q = Quantity(int64(x))
	default:
		return fmt.Errorf("must be a size like \"16Gi\"")
	}
	return nil
}
