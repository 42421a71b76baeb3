package workdir

import (
	"bufio"
	"os"
	"path"
	"strings"
)

// rule is one line of a .gitignore or .spillwayignore.
type rule struct {
	base     string // directory of the ignore file, "" at the top
	pattern  string
	negate   bool
	dirOnly  bool
	anchored bool // has a slash before the end: matched from base
}

// readIgnore reads an ignore file; base is its directory relative to the
// packed root ("" at the top).
func readIgnore(file, base string) []rule {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []rule
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := rule{base: base}
		if strings.HasPrefix(line, "!") {
			r.negate, line = true, line[1:]
		}
		line = strings.TrimPrefix(line, `\`)
		if strings.HasSuffix(line, "/") {
			r.dirOnly, line = true, strings.TrimSuffix(line, "/")
		}
		if strings.Contains(line, "/") {
			r.anchored, line = true, strings.TrimPrefix(line, "/")
		}
		if line == "" {
			continue
		}
		r.pattern = line
		out = append(out, r)
	}
	return out
}

// ignored reports whether rel (slash-separated, relative to the root) is
// excluded by rules, the last matching rule winning as in git.
func ignored(rules []rule, rel string, isDir bool) bool {
	out := false
	for _, r := range rules {
		sub := rel
		if r.base != "" {
			var ok bool
			if sub, ok = strings.CutPrefix(rel, r.base+"/"); !ok {
				continue
			}
		}
		if r.dirOnly && !isDir {
			continue
		}
		if r.match(sub) {
			out = !r.negate
		}
	}
	return out
}

func (r rule) match(sub string) bool {
	if r.anchored {
		return globMatch(r.pattern, sub)
	}
	// Unanchored: the name at any depth.
	return globMatch(r.pattern, path.Base(sub))
}

// globMatch matches a slash-separated path against a pattern where **
// spans directories and *, ?, [..] stay within one.
func globMatch(pattern, name string) bool {
	ps := strings.Split(pattern, "/")
	ns := strings.Split(name, "/")
	return matchParts(ps, ns)
}

func matchParts(ps, ns []string) bool {
	for len(ps) > 0 {
		if ps[0] == "**" {
			for i := 0; i <= len(ns); i++ {
				if matchParts(ps[1:], ns[i:]) {
					return true
				}
			}
			return false
		}
		if len(ns) == 0 {
			return false
		}
		if ok, _ := path.Match(ps[0], ns[0]); !ok {
			return false
		}
		ps, ns = ps[1:], ns[1:]
	}
	return len(ns) == 0
}
