package sim

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/slurm"
)

// SacctOptions say how Slurm accounting becomes a trace.
type SacctOptions struct {
	// Location is the zone sacct printed its times in (the TZ of the host
	// that ran sacct); default UTC.
	Location *time.Location
	// Team is the team of jobs without an Account; default "slurm".
	Team string
	// Queue and Priority are given to every job; default "default" and
	// "medium". With PartitionQueue the job's Partition is its queue.
	Queue, Priority string
	PartitionQueue  bool
}

// sacctColumns are the columns ReadSacct needs, by their sacct names.
var sacctColumns = []string{"JobID", "Submit", "Start", "End", "AllocTRES"}

// ReadSacct reads Slurm accounting as a trace: the output of
//
//	sacct --parsable2 --allusers -X -o JobID,Submit,Start,End,AllocTRES,Account,Partition
//
// (header line included; columns in any order, extra ones ignored). A job
// is its allocation line: steps ("42.batch") are skipped, and so are jobs
// that never started, are still running, or hold no GPU (AllocTRES
// without gres/gpu). The duration is End-Start, at least one second (sacct
// counts whole seconds). The Account is the team. Jobs come back in submit
// order, named "s" and their place; a dump with no job left says how many
// lines were skipped for which reason.
func ReadSacct(r io.Reader, opt SacctOptions) (*Trace, error) {
	loc := cmp.Or(opt.Location, time.UTC)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("read sacct: %w", err)
		}
		return nil, fmt.Errorf("read sacct: empty input, want a header line %s|…", strings.Join(sacctColumns, "|"))
	}
	head := strings.Split(strings.TrimSpace(sc.Text()), "|")
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, c := range sacctColumns {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("sacct header %q lacks %s: run sacct --parsable2 -o %s,Account", tailOf(sc.Text(), 120), c, strings.Join(sacctColumns, ","))
		}
	}
	get := func(f []string, name string) string {
		if i, ok := col[name]; ok && i < len(f) {
			return strings.TrimSpace(f[i])
		}
		return ""
	}
	tr := &Trace{Location: loc}
	skipped := map[string]int{}
	for line := 2; sc.Scan(); line++ {
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		f := strings.Split(text, "|")
		if len(f) != len(head) {
			return nil, fmt.Errorf("sacct line %d: %d fields, the header has %d", line, len(f), len(head))
		}
		id := get(f, "JobID")
		if id == "" {
			return nil, fmt.Errorf("sacct line %d: empty JobID", line)
		}
		if strings.Contains(id, ".") {
			skipped["steps"]++
			continue
		}
		sub, ok := slurm.ParseTime(get(f, "Submit"), loc)
		if !ok {
			return nil, fmt.Errorf("sacct line %d (job %s): Submit %q is not a time like 2026-12-01T16:09:55", line, id, get(f, "Submit"))
		}
		start, ok1 := slurm.ParseTime(get(f, "Start"), loc)
		end, ok2 := slurm.ParseTime(get(f, "End"), loc)
		if !ok1 {
			skipped["never started"]++
			continue
		}
		if !ok2 {
			skipped["still running"]++
			continue
		}
		if end.Before(start) || start.Before(sub) {
			return nil, fmt.Errorf("sacct line %d (job %s): times out of order: submit %s, start %s, end %s", line, id, get(f, "Submit"), get(f, "Start"), get(f, "End"))
		}
		gpus := slurm.GPUsOf(get(f, "AllocTRES"))
		if gpus < 1 {
			skipped["without GPUs"]++
			continue
		}
		if gpus > maxTraceGPUs {
			return nil, fmt.Errorf("sacct line %d (job %s): %d GPUs, at most %d", line, id, gpus, maxTraceGPUs)
		}
		queue := cmp.Or(opt.Queue, "default")
		if opt.PartitionQueue && get(f, "Partition") != "" {
			queue = get(f, "Partition")
		}
		tr.Jobs = append(tr.Jobs, Job{Submit: sub, Duration: max(end.Sub(start), time.Second), GPUs: gpus,
			Team: cmp.Or(get(f, "Account"), opt.Team, "slurm"), Priority: cmp.Or(opt.Priority, "medium"), Queue: queue})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read sacct: %w", err)
	}
	if len(tr.Jobs) == 0 {
		return nil, fmt.Errorf("sacct: no job that ran with GPUs (skipped: %v)", skipped)
	}
	sortJobs(tr.Jobs)
	numberJobs(tr.Jobs, "s")
	return tr, nil
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
