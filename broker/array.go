package broker

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxArraySize is the most elements one array submit may make.
const MaxArraySize = 10000

// ArrayHint says how an array's indexes are written, for the errors that
// refuse them.
const ArrayHint = "write indexes like 0-999, 1,3,5-7 or 0-15:4, and %N for at most N running at once"

// ElementName is how a job is named where it is listed: its name, with
// its index when it is an array's element (eval[7]).
func ElementName(name string, index *int) string {
	if index == nil {
		return name
	}
	return name + "[" + strconv.Itoa(*index) + "]"
}

// maxArrayIndex is the largest index an array may name.
const maxArrayIndex = 1_000_000

// ParseArray reads an array's indexes as Slurm's --array writes them: a
// comma-separated list of indexes and ranges, each range with an optional
// step ("0-999", "1,3,5", "0-15:4", "0-9,20-29"), then optionally "%N",
// the most elements that may run at once ("0-999%10"). It returns the
// indexes in ascending order, each once, and the limit (0: none), or an
// error saying what is wrong.
func ParseArray(s string) ([]int, int, error) {
	if len(s) > 1024 {
		return nil, 0, fmt.Errorf("is longer than 1024 characters")
	}
	s, limitText, hasLimit := strings.Cut(s, "%")
	limit := 0
	if hasLimit {
		n, err := arrayIndex(limitText)
		if err != nil || n < 1 || n > MaxArraySize {
			return nil, 0, fmt.Errorf("%%%s: the most elements running at once must be a whole number from 1 to %d", clip(limitText), MaxArraySize)
		}
		limit = n
	}
	idx, err := parseIndexes(s)
	return idx, limit, err
}

func parseIndexes(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("is empty")
	}
	seen := map[int]bool{}
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		rng, stepText, hasStep := strings.Cut(part, ":")
		lo, hi, isRange := strings.Cut(rng, "-")
		from, err := arrayIndex(lo)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", clip(part), err)
		}
		to, step := from, 1
		if isRange {
			if to, err = arrayIndex(hi); err != nil {
				return nil, fmt.Errorf("%q: %v", clip(part), err)
			}
			if to < from {
				return nil, fmt.Errorf("%q: a range must go up (%d-%d)", clip(part), from, to)
			}
		}
		if hasStep {
			if !isRange {
				return nil, fmt.Errorf("%q: a step needs a range (like 0-15:4)", clip(part))
			}
			n, err := strconv.Atoi(stepText)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%q: the step must be a whole number of at least 1", clip(part))
			}
			step = n
		}
		if (to-from)/step+1+len(out) > MaxArraySize {
			return nil, fmt.Errorf("has more than %d elements", MaxArraySize)
		}
		for i := from; i <= to; i += step {
			if !seen[i] {
				seen[i] = true
				out = append(out, i)
			}
		}
	}
	sortInts(out)
	return out, nil
}

// FormatIndexes writes ascending indexes as ParseArray reads them, runs
// of consecutive ones as ranges: [0 1 2 3 7 9 10] is "0-3,7,9-10".
func FormatIndexes(idx []int) string {
	var b strings.Builder
	for i := 0; i < len(idx); {
		k := i
		for k+1 < len(idx) && idx[k+1] == idx[k]+1 {
			k++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(idx[i]))
		if k > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(idx[k]))
		}
		i = k + 1
	}
	return b.String()
}

// ValidArrayID reports whether id has the shape of an array's id (and a
// job's): 26 characters of Crockford's base 32, as ULIDs are written.
func ValidArrayID(id string) bool {
	if len(id) != 26 || id[0] > '7' {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !strings.ContainsRune(crockford, rune(id[i])) {
			return false
		}
	}
	return true
}

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

func arrayIndex(s string) (int, error) {
	if s == "" || len(s) > 7 {
		return 0, fmt.Errorf("indexes are whole numbers from 0 to %d", maxArrayIndex)
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("indexes are whole numbers from 0 to %d", maxArrayIndex)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > maxArrayIndex {
		return 0, fmt.Errorf("indexes are whole numbers from 0 to %d", maxArrayIndex)
	}
	return n, nil
}

func sortInts(xs []int) {
	// Insertion into an almost sorted list: ranges come in order.
	for i := 1; i < len(xs); i++ {
		for k := i; k > 0 && xs[k] < xs[k-1]; k-- {
			xs[k], xs[k-1] = xs[k-1], xs[k]
		}
	}
}
