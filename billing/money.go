// Package billing is Spillway's one ledger of GPU-time, for owned, cloud and
// leased GPUs alike, and the reports and exports finance reads from it.
package billing

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Amount is money in millionths of the currency unit ("micros"): 1.23 USD is
// 1_230_000. Integer arithmetic keeps sums exact; an int64 holds amounts up
// to about 9.2 trillion units. Prices per hour and per GPU-hour are Amounts
// too.
type Amount int64

// MicrosPerUnit is the number of micros in one currency unit.
const MicrosPerUnit = 1_000_000

// ParseAmount reads a decimal like "98.32", "-0.5" or "5000" with at most six
// decimal places.
func ParseAmount(s string) (Amount, error) {
	s = strings.TrimSpace(s)
	if a, ok := parsePlainAmount(s); ok {
		return a, nil
	}
	return parseRatAmount(s)
}

// parseRatAmount is ParseAmount on big.Rat: every form a decimal may take,
// and the errors.
func parseRatAmount(s string) (Amount, error) {
	r, ok := new(big.Rat).SetString(s)
	if !ok || s == "" || strings.ContainsAny(s, "eE/") {
		return 0, fmt.Errorf("%q is not a decimal amount like 12.34", s)
	}
	r.Mul(r, big.NewRat(MicrosPerUnit, 1))
	if !r.IsInt() {
		return 0, fmt.Errorf("%q has more than 6 decimal places", s)
	}
	n := r.Num()
	if !n.IsInt64() {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return Amount(n.Int64()), nil
}

// parsePlainAmount is ParseAmount's fast path for what the ledger and the
// budgets write ("-12.345678", "5000"): an optional minus, 1 to 12 digits (no overflow),
// optionally a point and 1 to 6 digits. Anything else (a plus sign, a
// leading point, more digits) is left to big.Rat, which gives the same
// value or the error.
func parsePlainAmount(s string) (Amount, bool) {
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	whole, frac, dot := strings.Cut(s, ".")
	if len(whole) == 0 || len(whole) > 12 || (dot && (len(frac) == 0 || len(frac) > 6)) {
		return 0, false
	}
	var v int64
	for i := 0; i < len(whole); i++ {
		c := whole[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	v *= MicrosPerUnit
	scale := int64(MicrosPerUnit / 10)
	for i := 0; i < len(frac); i++ {
		c := frac[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v += int64(c-'0') * scale
		scale /= 10
	}
	if neg {
		v = -v
	}
	return Amount(v), true
}

// String prints the amount with as many decimals as it needs, at least two:
// "98.32", "0.000125", "-5.00".
func (a Amount) String() string {
	neg := a < 0
	u := uint64(a)
	if neg {
		u = uint64(-a)
		if a == math.MinInt64 {
			u = uint64(math.MaxInt64) + 1
		}
	}
	whole, frac := u/MicrosPerUnit, u%MicrosPerUnit
	var buf [32]byte
	b := buf[:0]
	if neg {
		b = append(b, '-')
	}
	b = strconv.AppendUint(b, whole, 10)
	b = append(b, '.')
	// six digits of the fraction, then drop trailing zeros down to two
	var fd [6]byte
	for i := 5; i >= 0; i-- {
		fd[i] = byte('0' + frac%10)
		frac /= 10
	}
	n := 6
	for n > 2 && fd[n-1] == '0' {
		n--
	}
	return string(append(b, fd[:n]...))
}

// Cents prints the amount rounded half away from zero to two decimals, as
// people read money: "4980.00".
func (a Amount) Cents() string {
	r := int64(a.Round(10_000))
	sign := ""
	if r < 0 {
		sign, r = "-", -r
	}
	return fmt.Sprintf("%s%d.%02d", sign, r/MicrosPerUnit, r%MicrosPerUnit/10_000)
}

// Round rounds to a multiple of unit micros, half away from zero.
func (a Amount) Round(unit int64) Amount {
	v := int64(a)
	q, rem := v/unit, v%unit
	if abs64(rem)*2 >= unit {
		if v < 0 {
			q--
		} else {
			q++
		}
	}
	return Amount(q * unit)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// MarshalJSON writes the amount as a JSON string with its exact decimals, so
// no consumer turns it into a float by accident.
func (a Amount) MarshalJSON() ([]byte, error) { return json.Marshal(a.String()) }

// UnmarshalJSON reads a decimal string or a JSON number.
func (a *Amount) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	v, err := ParseAmount(s)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// MulDiv returns a*num/den rounded half away from zero, without overflow for
// any operands whose true result fits in an Amount. It is how a per-hour
// price becomes the cost of some GPU-milliseconds.
func (a Amount) MulDiv(num, den int64) Amount {
	if den == 0 {
		return 0
	}
	p := new(big.Int).Mul(big.NewInt(int64(a)), big.NewInt(num))
	d := big.NewInt(den)
	q, m := new(big.Int).QuoRem(p, d, new(big.Int))
	// round half away from zero
	m2 := new(big.Int).Mul(new(big.Int).Abs(m), big.NewInt(2))
	if m2.Cmp(new(big.Int).Abs(d)) >= 0 {
		if (p.Sign() < 0) != (d.Sign() < 0) {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	return Amount(q.Int64())
}
