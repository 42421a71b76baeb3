// Package slurm speaks the parts of Slurm that Spillway needs as Slurm's
// burst provider: hostlist expressions (the node lists slurmctld hands its
// ResumeProgram and SuspendProgram), the commands that change a node's
// state and address, and the readers of squeue and sacct output. It runs
// no daemon of its own; everything goes through Slurm's client commands.
package slurm

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxHosts bounds how many names one hostlist may expand to, so a hostile
// or mistyped range ("n[0-999999999]") is an error, not an allocation.
const MaxHosts = 65536

// Expand turns a Slurm hostlist expression into host names in order:
//
//	burst-[1-4,7],gpu-a[01-03]  →  burst-1 … burst-4, burst-7, gpu-a01 … gpu-a03
//
// Ranges keep the width of their lower bound's zero padding, as Slurm
// does ("[01-10]" gives 01 … 10). Several bracket groups in one name
// multiply ("r[1-2]n[1-2]" → r1n1, r1n2, r2n1, r2n2). Duplicates are kept
// in order of appearance, as scontrol show hostnames keeps them.
func Expand(expr string) ([]string, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return nil, fmt.Errorf("hostlist: empty")
	}
	var out []string
	for _, item := range splitTop(expr) {
		if item == "" {
			return nil, fmt.Errorf("hostlist %q: empty name between commas", expr)
		}
		names, err := expandItem(item, MaxHosts-len(out))
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", expr, err)
		}
		out = append(out, names...)
	}
	return out, nil
}

// splitTop splits at commas outside brackets; an unbalanced bracket is
// left in place for expandItem to report.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// expandItem expands one name with zero or more bracket groups, giving at
// most limit names.
func expandItem(item string, limit int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.IndexByte(item, ']') >= 0 {
			return nil, fmt.Errorf("%q: ']' without '['", item)
		}
		if err := checkName(item); err != nil {
			return nil, err
		}
		if limit < 1 {
			return nil, fmt.Errorf("more than %d hosts", MaxHosts)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("%q: '[' without ']'", item)
	}
	end += open
	prefix, body, rest := item[:open], item[open+1:end], item[end+1:]
	if strings.ContainsAny(prefix, "]") || strings.ContainsAny(body, "[") {
		return nil, fmt.Errorf("%q: nested or unbalanced brackets", item)
	}
	if err := checkName(prefix); err != nil && prefix != "" {
		return nil, err
	}
	parts, err := expandRanges(body, limit)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", item, err)
	}
	var out []string
	for _, p := range parts {
		tails := []string{""}
		if rest != "" {
			if tails, err = expandItem(rest, limit/max(len(parts), 1)); err != nil {
				return nil, err
			}
		}
		for _, t := range tails {
			if len(out) >= limit {
				return nil, fmt.Errorf("more than %d hosts", MaxHosts)
			}
			out = append(out, prefix+p+t)
		}
	}
	return out, nil
}

// expandRanges expands the inside of one bracket group: "1-4,7,09-11".
func expandRanges(body string, limit int) ([]string, error) {
	if body == "" {
		return nil, fmt.Errorf("empty brackets")
	}
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		if !digits(lo) || !digits(hi) {
			return nil, fmt.Errorf("range %q: want N or N-M with decimal digits", r)
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("range %q: number too large", r)
		}
		if b < a {
			return nil, fmt.Errorf("range %q: end below start", r)
		}
		if b-a >= limit-len(out) {
			return nil, fmt.Errorf("more than %d hosts", MaxHosts)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for n := a; n <= b; n++ {
			out = append(out, fmt.Sprintf("%0*d", width, n))
		}
	}
	return out, nil
}

func digits(s string) bool {
	if s == "" || len(s) > 9 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// checkName accepts the characters Slurm node names use: letters, digits,
// '-', '_' and '.'.
func checkName(s string) error {
	if s == "" {
		return fmt.Errorf("empty host name")
	}
	if len(s) > 64 {
		return fmt.Errorf("host name %.20q…: longer than 64 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("host name %q: character %q is not allowed (letters, digits, '-', '_', '.')", s, c)
		}
	}
	return nil
}

// Compress writes names as one hostlist expression, folding runs of
// numbered names with one prefix and width into brackets: the inverse of
// Expand for lists in order.
func Compress(names []string) string {
	var items []string
	i := 0
	for i < len(names) {
		prefix, num, width, ok := splitNum(names[i])
		if !ok {
			items = append(items, names[i])
			i++
			continue
		}
		var ranges []string
		lo, hi := num, num
		j := i + 1
		for ; j < len(names); j++ {
			p, n, w, ok := splitNum(names[j])
			if !ok || p != prefix || w != width || n <= hi {
				break
			}
			if n == hi+1 {
				hi = n
				continue
			}
			ranges = append(ranges, fmtRange(lo, hi, width))
			lo, hi = n, n
		}
		ranges = append(ranges, fmtRange(lo, hi, width))
		if j == i+1 {
			items = append(items, names[i])
		} else {
			items = append(items, prefix+"["+strings.Join(ranges, ",")+"]")
		}
		i = j
	}
	return strings.Join(items, ",")
}

func fmtRange(lo, hi, width int) string {
	if lo == hi {
		return fmt.Sprintf("%0*d", width, lo)
	}
	return fmt.Sprintf("%0*d-%0*d", width, lo, width, hi)
}

// splitNum splits "gpu-a07" into "gpu-a", 7 and width 2 (0 when the
// number has no leading zero).
func splitNum(s string) (string, int, int, bool) {
	k := len(s)
	for k > 0 && s[k-1] >= '0' && s[k-1] <= '9' {
		k--
	}
	d := s[k:]
	if d == "" || len(d) > 9 || strings.ContainsAny(s, "[],") {
		return "", 0, 0, false
	}
	n, _ := strconv.Atoi(d)
	w := 0
	if len(d) > 1 && d[0] == '0' {
		w = len(d)
	}
	if w == 0 && len(d) > 1 && n == 0 {
		return "", 0, 0, false
	}
	return s[:k], n, w, true
}
