package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/exp/trace"
)

// regionStats is what one runtime/trace holds of its user regions
// (trace.StartRegion): every occurrence's length by region type, and the
// occurrences longer than a threshold, with when they began.
type regionStats struct {
	span time.Duration
	lens map[string][]time.Duration
	long []longRegion
}

type longRegion struct {
	name  string
	at    time.Duration // from the trace's first event
	taken time.Duration
}

// readRegions reads a runtime/trace (golang.org/x/exp/trace, the parser
// of the Go team's tooling) and collects its regions; an occurrence of
// at least long is listed on its own.
func readRegions(r io.Reader, long time.Duration) (*regionStats, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	type key struct {
		g    trace.GoID
		name string
	}
	open := map[key][]trace.Time{}
	st := &regionStats{lens: map[string][]time.Duration{}}
	var first, last trace.Time
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if first == 0 {
			first = ev.Time()
		}
		last = ev.Time()
		switch ev.Kind() {
		case trace.EventRegionBegin:
			k := key{ev.Goroutine(), ev.Region().Type}
			open[k] = append(open[k], ev.Time())
		case trace.EventRegionEnd:
			k := key{ev.Goroutine(), ev.Region().Type}
			s := open[k]
			if len(s) == 0 {
				continue // began before the trace did
			}
			began := s[len(s)-1]
			open[k] = s[:len(s)-1]
			d := time.Duration(ev.Time() - began)
			st.lens[k.name] = append(st.lens[k.name], d)
			if long > 0 && d >= long {
				st.long = append(st.long, longRegion{k.name, time.Duration(began - first), d})
			}
		}
	}
	st.span = time.Duration(last - first)
	return st, nil
}

// print writes one line per region type (count, p50, p90, max, total)
// and the long occurrences.
func (st *regionStats) print(w io.Writer, name string, long time.Duration) {
	fmt.Fprintf(w, "regions of %s (%.2f s traced)\n", name, st.span.Seconds())
	for _, n := range slices.Sorted(maps.Keys(st.lens)) {
		d := slices.Clone(st.lens[n])
		slices.Sort(d)
		var total time.Duration
		for _, x := range d {
			total += x
		}
		fmt.Fprintf(w, "  %-22s n %6d  p50 %9s  p90 %9s  max %9s  total %s\n", n, len(d),
			round(d[len(d)/2]), round(d[len(d)*9/10]), round(d[len(d)-1]), total.Round(time.Millisecond))
	}
	for _, l := range st.long {
		fmt.Fprintf(w, "  over %s: %s at %.3f s took %s\n", long, l.name, l.at.Seconds(), round(l.taken))
	}
}

func round(d time.Duration) time.Duration {
	if d >= time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// printRegions summarises the broker's trace (-trace) and each agent's
// (-agent-profile) after a replay.
func printRegions(w io.Writer, o options) error {
	var files []string
	if o.traceFile != "" {
		files = append(files, o.traceFile)
	}
	if o.agentProfile != "" {
		agents, err := filepath.Glob(filepath.Join(o.agentProfile, "*.trace"))
		if err != nil {
			return err
		}
		for _, a := range agents {
			if !slices.Contains(files, a) {
				files = append(files, a)
			}
		}
	}
	if len(files) == 0 {
		return errors.New("-regions needs -trace or -agent-profile")
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		st, err := readRegions(fh, o.longRegion)
		fh.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		st.print(w, f, o.longRegion)
	}
	return nil
}
