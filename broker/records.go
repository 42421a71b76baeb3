package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
)

func getJSON(tx Tx, b Bucket, key string, v any) error {
	raw, err := tx.Get(b, key)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode %s/%s: %w", b, key, err)
	}
	return nil
}

func putJSON(tx Tx, b Bucket, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", b, key, err)
	}
	return tx.Put(b, key, raw)
}

// GetJob reads one job, or returns ErrNotFound.
func GetJob(tx Tx, id string) (*Job, error) {
	var j Job
	if err := getJSON(tx, BucketJobs, id, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// PutJob writes a job and keeps the active index equal to the set of
// non-terminal jobs.
func PutJob(tx Tx, j *Job) error {
	raw, err := json.Marshal(j)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", BucketJobs, j.ID, err)
	}
	return PutJobEncoded(tx, j, raw)
}

// PutJobEncoded is PutJob with j already encoded as JSON (raw), for a
// caller that answers with the same bytes (a submit).
func PutJobEncoded(tx Tx, j *Job, raw []byte) error {
	if err := tx.Put(BucketJobs, j.ID, raw); err != nil {
		return err
	}
	if err := tx.Put(BucketTeamJobs, teamJobKey(j.Spec.Team, j.ID), nil); err != nil {
		return err
	}
	if j.State.Terminal() {
		return tx.Delete(BucketActive, j.ID)
	}
	return tx.Put(BucketActive, j.ID, nil)
}

// ActiveJobs returns every non-terminal job, oldest id first.
func ActiveJobs(tx Tx) ([]*Job, error) {
	var ids []string
	if err := tx.Scan(BucketActive, "", "", func(id string, _ []byte) error {
		ids = append(ids, id)
		return nil
	}); err != nil {
		return nil, err
	}
	return GetJobs(tx, ids)
}

// GetJobs reads the jobs ids name, in order, a thousand at a time through
// GetMany (one round trip each on Redis); a missing one is an error. The
// records are decoded on every processor: decoding is most of a restart's
// load.
func GetJobs(tx Tx, ids []string) ([]*Job, error) {
	out := make([]*Job, len(ids))
	for from := 0; from < len(ids); from += getJobsChunk {
		chunk := ids[from:min(len(ids), from+getJobsChunk)]
		raws, err := GetMany(tx, BucketJobs, chunk)
		if err != nil {
			return nil, err
		}
		// A few records (a listing's batch) decode faster in place than
		// goroutines start.
		workers := max(1, min(runtime.GOMAXPROCS(0), len(chunk)/128))
		errs := make([]error, workers)
		decode := func(w int) {
			for i := w * len(chunk) / workers; i < (w+1)*len(chunk)/workers; i++ {
				if raws[i] == nil {
					errs[w] = fmt.Errorf("job %s: %w", chunk[i], ErrNotFound)
					return
				}
				j := new(Job)
				if err := json.Unmarshal(raws[i], j); err != nil {
					errs[w] = fmt.Errorf("decode %s/%s: %w", BucketJobs, chunk[i], err)
					return
				}
				out[from+i] = j
			}
		}
		var wg sync.WaitGroup
		for w := 1; w < workers; w++ {
			wg.Go(func() { decode(w) })
		}
		decode(0)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// getJobsChunk is how many jobs GetJobs reads at a time.
const getJobsChunk = 1000

// JobFilter selects jobs in ListJobs. Empty fields match everything.
type JobFilter struct {
	States []State
	Team   string
	Queue  string
	// Array keeps only the elements of this array (its id, as an array
	// submit answers it).
	Array string
	// Cursor continues a listing: only jobs with ids before it (newer
	// listings come first, ids sort by submit time).
	Cursor string
	Limit  int
	// FoldArrays lists an array's waiting elements as one, as squeue
	// does: the first one met stands for the others, which go to
	// JobPage.Folded under the array's id and do not count against
	// Limit.
	FoldArrays bool
}

// JobPage is one page of a listing.
type JobPage struct {
	Jobs []*Job
	// Next is the cursor for the next page, "" when there is none.
	Next string
	// Folded are the waiting array elements a listed one stands for
	// (JobFilter.FoldArrays), by array id.
	Folded map[string][]*Job
}

// Match reports whether j is one the filter lists (the cursor and the
// limit aside).
func (f JobFilter) Match(j *Job) bool {
	if f.Team != "" && j.Spec.Team != f.Team {
		return false
	}
	if f.Queue != "" && j.Spec.Queue != f.Queue {
		return false
	}
	if f.Array != "" && j.ArrayID != f.Array {
		return false
	}
	if len(f.States) > 0 {
		for _, s := range f.States {
			if j.State == s {
				return true
			}
		}
		return false
	}
	return true
}

// limit is the page size: Limit, or 100 when unset.
func (f JobFilter) limit() int {
	if f.Limit <= 0 {
		return 100
	}
	return f.Limit
}

// folds reports whether j is one of the array elements that the listing
// shows under one line (FoldArrays: the waiting ones).
func (f JobFilter) folds(j *Job) bool {
	return f.FoldArrays && j.ArrayID != "" && j.State == StatePending
}

// OnlyActive reports whether every state the filter asks for is
// non-terminal, so the active index (or the leader's view, which holds the
// same jobs) can serve the listing.
func (f JobFilter) OnlyActive() bool {
	if len(f.States) == 0 {
		return false
	}
	for _, s := range f.States {
		if s.Terminal() {
			return false
		}
	}
	return true
}

// pager builds one page of a listing from the jobs met newest first.
type pager struct {
	f      JobFilter
	pg     JobPage
	last   string          // the oldest id on the page, listed or folded
	folded map[string]bool // the arrays with a row on the page
}

func newPager(f JobFilter) *pager {
	f.Limit = f.limit()
	return &pager{f: f, folded: map[string]bool{}}
}

// visit takes the next job, newest first; ErrStopScan: the page is full.
func (p *pager) visit(j *Job) error {
	f, pg := &p.f, &p.pg
	if !f.Match(j) {
		return nil
	}
	foldable := f.folds(j)
	if foldable && p.folded[j.ArrayID] {
		if pg.Folded == nil {
			pg.Folded = map[string][]*Job{}
		}
		pg.Folded[j.ArrayID] = append(pg.Folded[j.ArrayID], j)
		p.last = j.ID
		return nil
	}
	if len(pg.Jobs) == f.Limit {
		pg.Next = p.last
		return ErrStopScan
	}
	if foldable {
		p.folded[j.ArrayID] = true
	}
	pg.Jobs = append(pg.Jobs, j)
	p.last = j.ID
	return nil
}

// PageJobs is ListJobs over jobs already in hand, in any order (fastest
// oldest first), such as the leader's view of the active ones: the same
// page, cursor and folding as ListJobs gives over the store, at the cost
// of one pass and a heap of f.Limit+1 rows, not a sort of every job.
// Folded elements come in no particular order.
func PageJobs(f JobFilter, jobs []*Job) JobPage {
	f.Limit = f.limit()
	// A row is a job, or an array's waiting elements under the newest of
	// them when folding.
	rows := NewHead(f.Limit+1, newestFirst)
	groups := map[string][]*Job{}
	// From the end: a caller that holds its jobs roughly in submit order,
	// as the leader's view does, gives the newest first, and once the heap
	// is full most of the rest are turned away by one comparison.
	for _, j := range slices.Backward(jobs) {
		if (f.Cursor != "" && j.ID >= f.Cursor) || !f.Match(j) {
			continue
		}
		if f.folds(j) {
			groups[j.ArrayID] = append(groups[j.ArrayID], j)
			continue
		}
		rows.Offer(j)
	}
	for _, g := range groups {
		rows.Offer(slices.MaxFunc(g, func(a, b *Job) int { return strings.Compare(a.ID, b.ID) }))
	}
	var pg JobPage
	pg.Jobs = rows.Sorted()
	// ListJobs meets the jobs newest first and stops at the first row past
	// the page: only what is newer than that row is on the page.
	bound := ""
	if len(pg.Jobs) > f.Limit {
		bound = pg.Jobs[f.Limit].ID
		pg.Jobs = pg.Jobs[:f.Limit]
	}
	if len(pg.Jobs) == 0 {
		return JobPage{}
	}
	last := pg.Jobs[len(pg.Jobs)-1].ID
	for _, row := range pg.Jobs {
		g := groups[row.ArrayID]
		if row.ArrayID == "" || row.State != StatePending || len(g) < 2 {
			continue
		}
		for _, e := range g {
			if e != row && e.ID > bound {
				if pg.Folded == nil {
					pg.Folded = map[string][]*Job{}
				}
				pg.Folded[row.ArrayID] = append(pg.Folded[row.ArrayID], e)
				last = min(last, e.ID)
			}
		}
	}
	if bound != "" {
		pg.Next = last
	}
	return pg
}

// newestFirst orders jobs by id, newest first (a page's order).
func newestFirst(a, b *Job) int { return strings.Compare(b.ID, a.ID) }

// ListJobs returns up to f.Limit jobs matching f, newest first, and the
// cursor for the next page.
func ListJobs(tx Tx, f JobFilter) (JobPage, error) {
	p := newPager(f)
	visit := p.visit
	decode := func(_ string, raw []byte) error {
		var j Job
		if err := json.Unmarshal(raw, &j); err != nil {
			return err
		}
		return visit(&j)
	}
	var err error
	if f.Array != "" {
		// An array's elements get their ids with the array's, in one go:
		// they sort just after it and share its first 10 characters (a
		// ULID's time), so that range holds them all, and little else.
		if !ValidArrayID(f.Array) {
			return JobPage{}, nil
		}
		to := PrefixEnd(f.Array[:10])
		if f.Cursor != "" && f.Cursor < to {
			to = f.Cursor
		}
		err = tx.ScanReverse(BucketJobs, f.Array, to, decode)
	} else if f.OnlyActive() {
		// Active jobs only: the active index, which holds what runs or
		// waits now, not a team's index, which holds its whole past.
		err = scanIndexedJobs(tx, BucketActive, "", f.Cursor, "", visit)
	} else if f.Team != "" {
		// One team's jobs: its index, not every job (finding 6).
		prefix := f.Team + "/"
		to := PrefixEnd(prefix)
		if f.Cursor != "" {
			to = prefix + f.Cursor
		}
		err = scanIndexedJobs(tx, BucketTeamJobs, prefix, to, prefix, visit)
	} else {
		err = tx.ScanReverse(BucketJobs, "", f.Cursor, decode)
	}
	if err != nil && !errors.Is(err, ErrStopScan) {
		return JobPage{}, err
	}
	return p.pg, nil
}

// scanIndexedJobs visits, newest first, the jobs an index (active, or a
// team's) names in [from, to), each key less prefix being a job id. The
// jobs are read indexBatch at a time (one round trip on Redis), so a
// visit that stops early has had at most one batch read beyond it.
func scanIndexedJobs(tx Tx, index Bucket, from, to, prefix string, visit func(*Job) error) error {
	ids := make([]string, 0, indexBatch)
	flush := func() error {
		jobs, err := GetJobs(tx, ids)
		if err != nil {
			return err
		}
		ids = ids[:0]
		for _, j := range jobs {
			if err := visit(j); err != nil {
				return err
			}
		}
		return nil
	}
	err := tx.ScanReverse(index, from, to, func(key string, _ []byte) error {
		ids = append(ids, key[len(prefix):])
		if len(ids) < indexBatch {
			return nil
		}
		return flush()
	})
	if err != nil {
		return err
	}
	return flush()
}

// indexBatch is how many jobs scanIndexedJobs reads at a time.
const indexBatch = 128

// GetNode reads one node, or returns ErrNotFound.
func GetNode(tx Tx, name string) (*Node, error) {
	var n Node
	if err := getJSON(tx, BucketNodes, name, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// PutNode writes a node.
func PutNode(tx Tx, n *Node) error { return putJSON(tx, BucketNodes, n.Name, n) }

// ListNodes returns every node by name.
func ListNodes(tx Tx) ([]*Node, error) {
	var out []*Node
	err := tx.Scan(BucketNodes, "", "", func(_ string, raw []byte) error {
		var n Node
		if err := json.Unmarshal(raw, &n); err != nil {
			return err
		}
		out = append(out, &n)
		return nil
	})
	return out, err
}

// LogMeta is what the store knows about one attempt's log.
type LogMeta struct {
	// Size is the number of bytes stored, kept equal to the sum of the
	// chunk lengths under the attempt's prefix in BucketLogs.
	Size int64 `json:"size"`
	// Dropped counts bytes the agent sent past the store's cap.
	Dropped int64 `json:"dropped,omitempty"`
	// Marked is the length of the truncation marker stored after the
	// last byte kept (0 until the cap is reached); it counts in Size but
	// not in the agent's stream.
	Marked int64 `json:"marked,omitempty"`
}

// Received is how far into the agent's stream the store has accounted
// for: bytes kept plus bytes dropped past the cap. The agent resumes
// sending from here.
func (m LogMeta) Received() int64 { return m.Size - m.Marked + m.Dropped }

// LogTruncatedMarker is the line stored once where an attempt's log
// reaches the store's cap; later output is counted, acknowledged and
// dropped.
func LogTruncatedMarker(limit int64) string {
	return fmt.Sprintf("\n--- spillway: log truncated at %d bytes (agents.logLimit); later output dropped ---\n", limit)
}

func logKey(job string, attempt int) string { return job + "/" + fmt.Sprintf("%06d", attempt) }

func logChunkKey(job string, attempt int, off int64) string {
	return logKey(job, attempt) + "/" + fmt.Sprintf("%016d", off)
}

// GetLogMeta returns the log size of one attempt (zero if none).
func GetLogMeta(tx Tx, job string, attempt int) (LogMeta, error) {
	var m LogMeta
	err := getJSON(tx, BucketLogMeta, logKey(job, attempt), &m)
	if errors.Is(err, ErrNotFound) {
		err = nil
	}
	return m, err
}

// AppendLog stores the part of data (which starts at byte offset off of the
// attempt's stream as the agent sends it) that the store does not have yet,
// up to limit bytes in all. Sending the same chunk twice is a no-op. Past
// the cap a marker line is stored once and later bytes are counted as
// dropped, so the agent's offset always advances: a chunk that starts at
// Received is never refused. It returns the new meta.
func AppendLog(tx Tx, job string, attempt int, off int64, data []byte, limit int64) (LogMeta, error) {
	m, err := GetLogMeta(tx, job, attempt)
	if err != nil {
		return m, err
	}
	got := m.Received()
	end := off + int64(len(data))
	if end <= got {
		return m, nil // already have it
	}
	if off > got {
		return m, fmt.Errorf("log chunk for %s at %d leaves a gap after %d: %w", job, off, got, ErrConflict)
	}
	data = data[got-off:]
	room := max(limit-m.Size, 0)
	if m.Marked > 0 {
		room = 0
	}
	var cut bool
	if int64(len(data)) > room {
		m.Dropped += int64(len(data)) - room
		data = data[:room]
		cut = m.Marked == 0
	}
	if len(data) > 0 {
		if err := tx.Put(BucketLogs, logChunkKey(job, attempt, m.Size), data); err != nil {
			return m, err
		}
		m.Size += int64(len(data))
	}
	if cut {
		marker := []byte(LogTruncatedMarker(limit))
		if err := tx.Put(BucketLogs, logChunkKey(job, attempt, m.Size), marker); err != nil {
			return m, err
		}
		m.Size += int64(len(marker))
		m.Marked = int64(len(marker))
	}
	return m, putJSON(tx, BucketLogMeta, logKey(job, attempt), m)
}

// ReadLog returns up to max bytes of an attempt's log starting at byte from.
func ReadLog(tx Tx, job string, attempt int, from int64, max int) ([]byte, error) {
	prefix := logKey(job, attempt) + "/"
	var out []byte
	// Find the chunk that holds `from`: the last chunk starting at or before it.
	start := prefix
	_ = tx.ScanReverse(BucketLogs, prefix, PrefixEnd(logChunkKey(job, attempt, from)), func(k string, _ []byte) error {
		start = k
		return ErrStopScan
	})
	err := tx.Scan(BucketLogs, start, PrefixEnd(prefix), func(k string, v []byte) error {
		off, err := strconv.ParseInt(k[len(prefix):], 10, 64)
		if err != nil {
			return fmt.Errorf("log key %q: %w", k, err)
		}
		if end := off + int64(len(v)); end <= from {
			return nil
		}
		if off < from {
			v = v[from-off:]
		}
		room := max - len(out)
		if len(v) > room {
			v = v[:room]
		}
		out = append(out, v...)
		if len(out) >= max {
			return ErrStopScan
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrStopScan) {
		return nil, err
	}
	return out, nil
}

// LastLines returns the suffix of b holding its last n lines.
func LastLines(b []byte, n int) []byte {
	if n == 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := 0; i < n; i++ {
		k := bytes.LastIndexByte(b[:end], '\n')
		if k < 0 {
			return b
		}
		if i == n-1 {
			return b[k+1:]
		}
		end = k
	}
	return b
}
