package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
)

// Item is one line of a workload file.
type Item struct {
	ID        string  `json:"id"`
	SubmitS   float64 `json:"submit_s"`
	GPUs      int     `json:"gpus"`
	DurationS float64 `json:"duration_s"`
	Priority  string  `json:"priority"`
	Team      string  `json:"team"`
}

// readWorkload reads a JSON-lines workload and checks every line.
func readWorkload(path string) ([]Item, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Item
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	seen := map[string]bool{}
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var it Item
		if err := json.Unmarshal(line, &it); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n, err)
		}
		switch {
		case it.ID == "" || seen[it.ID]:
			return nil, fmt.Errorf("%s:%d: id must be present and unique", path, n)
		case it.SubmitS < 0 || math.IsNaN(it.SubmitS):
			return nil, fmt.Errorf("%s:%d: submit_s must be ≥ 0", path, n)
		case it.GPUs < 1 || it.GPUs > 8:
			return nil, fmt.Errorf("%s:%d: gpus must be 1-8 (one node)", path, n)
		case it.DurationS < 0 || math.IsNaN(it.DurationS):
			return nil, fmt.Errorf("%s:%d: duration_s must be ≥ 0", path, n)
		case it.Team == "":
			return nil, fmt.Errorf("%s:%d: team must be present", path, n)
		}
		switch it.Priority {
		case "":
			it.Priority = "medium"
		case "low", "medium", "high":
		default:
			return nil, fmt.Errorf("%s:%d: priority must be low, medium or high", path, n)
		}
		seen[it.ID] = true
		out = append(out, it)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no jobs", path)
	}
	slices.SortStableFunc(out, func(a, b Item) int {
		switch {
		case a.SubmitS < b.SubmitS:
			return -1
		case a.SubmitS > b.SubmitS:
			return 1
		}
		return 0
	})
	return out, nil
}

// lowerBound is the least makespan any scheduler could reach on gpus cards:
// for every submit time t, t plus the work submitted from t on spread over
// all cards, and every job's own submit time plus its duration.
func lowerBound(items []Item, gpus int) float64 {
	lb := 0.0
	work := 0.0
	for i := len(items) - 1; i >= 0; i-- {
		it := items[i]
		work += float64(it.GPUs) * it.DurationS
		lb = max(lb, it.SubmitS+work/float64(gpus), it.SubmitS+it.DurationS)
	}
	return lb
}

// generate writes one of the standard workloads.
func generate(kind string, w io.Writer) error {
	enc := json.NewEncoder(w)
	switch kind {
	case "zero":
		for i := range 2000 {
			if err := enc.Encode(Item{ID: fmt.Sprintf("z%04d", i), GPUs: 1, Priority: "medium", Team: "nlp"}); err != nil {
				return err
			}
		}
	case "mixed":
		// 500 jobs arriving as a Poisson process of 5/s; 1/2/4/8 GPUs at
		// 50/25/15/10%; durations from 0.5 s with a long tail (mean about
		// 2.4 s); classes high/medium/low at 1:2:1; four teams. The
		// offered load is about 0.95 of 32 cards.
		r := rand.New(rand.NewPCG(20, 500))
		t := 0.0
		teams := []string{"nlp", "vision", "speech", "research"}
		for i := range 500 {
			if i > 0 {
				t += r.ExpFloat64() / 5
			}
			g := 1
			switch x := r.Float64(); {
			case x < 0.10:
				g = 8
			case x < 0.25:
				g = 4
			case x < 0.50:
				g = 2
			}
			d := math.Min(0.5+r.ExpFloat64()*1.9, 12)
			p := "medium"
			switch x := r.Float64(); {
			case x < 0.25:
				p = "high"
			case x < 0.50:
				p = "low"
			}
			it := Item{ID: fmt.Sprintf("m%03d", i), SubmitS: math.Round(t*1000) / 1000, GPUs: g,
				DurationS: math.Round(d*1000) / 1000, Priority: p, Team: teams[r.IntN(len(teams))]}
			if err := enc.Encode(it); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown workload %q: zero or mixed", kind)
	}
	return nil
}
