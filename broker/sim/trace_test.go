package sim

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestReadPhillySortsRowsAndReadsPacificTime(t *testing.T) {
	// Unsorted rows around the end of DST on 2017-11-05: 01:00-01:59
	// happens twice; the earlier instant (PDT) is taken.
	in := `timestamp,duration,num_gpus,gpu_time,cluster
2017-11-05 02:30:00,60.0,8,480.0,6214e9
2017-11-05 00:30:00,1.5,1,1.5,11cb48
2017-11-05 01:30:00,3600.0,2,7200.0,
2017-11-04 23:00:00,10.0,16,160.0,6214e9
`
	tr, err := ReadPhilly(strings.NewReader(in), PhillyOptions{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID       string
		Submit   time.Time
		Duration time.Duration
		GPUs     int
		Team     string
		Queue    string
	}
	var got []row
	for _, j := range tr.Jobs {
		got = append(got, row{j.ID, j.Submit.UTC(), j.Duration, j.GPUs, j.Team, j.Queue})
	}
	want := []row{
		{"p000001", utc("2017-11-05T06:00:00Z"), 10 * time.Second, 16, "6214e9", "high_perf"},
		{"p000002", utc("2017-11-05T07:30:00Z"), 1500 * time.Millisecond, 1, "11cb48", "default"},
		{"p000003", utc("2017-11-05T08:30:00Z"), time.Hour, 2, "unknown", "default"},
		{"p000004", utc("2017-11-05T10:30:00Z"), time.Minute, 8, "6214e9", "high_perf"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("jobs (-want +got):\n%s", diff)
	}
	// 00:30 PDT to 02:30 PST is three hours of real time, not two.
	if d := tr.Jobs[3].Submit.Sub(tr.Jobs[1].Submit); d != 3*time.Hour {
		t.Fatalf("00:30 to 02:30 across the DST change is %s, want 3h", d)
	}
}

func TestWallTimeInTheSpringGapMovesForward(t *testing.T) {
	la, err := time.LoadLocation(PhillyZone)
	if err != nil {
		t.Fatal(err)
	}
	// 2017-03-12 02:30 does not exist in Los Angeles; read with the offset
	// before the change (PST), it is 10:30 UTC, i.e. 03:30 PDT.
	got := wallTime(time.Date(2017, 3, 12, 2, 30, 0, 0, time.UTC), la)
	if !got.Equal(utc("2017-03-12T10:30:00Z")) {
		t.Fatalf("got %s", got.UTC())
	}
}

func TestReadPhillyErrorsNameTheLine(t *testing.T) {
	head := "timestamp,duration,num_gpus,gpu_time,cluster\n"
	cases := map[string]string{
		"wrong header":    "a,b,c,d,e\n",
		"bad timestamp":   head + "2017-11-05T02:30,60,1,60,x\n",
		"zero duration":   head + "2017-11-05 02:30:00,0,1,0,x\n",
		"too many GPUs":   head + "2017-11-05 02:30:00,10,5000,1,x\n",
		"missing columns": head + "2017-11-05 02:30:00,10,1\n",
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ReadPhilly(strings.NewReader(in), PhillyOptions{})
			if err == nil {
				t.Fatal("no error")
			}
			if name != "wrong header" && name != "missing columns" && !strings.Contains(err.Error(), "line 2") {
				t.Fatalf("error does not name line 2: %v", err)
			}
		})
	}
}

func TestPhillyPriorityRuleIsSeededAndStable(t *testing.T) {
	opt := PhillyOptions{Seed: 3}.withDefaults()
	counts := map[string]int{}
	const n = 20000
	for row := uint64(1); row <= n; row++ {
		p := phillyPriority(opt, row)
		if p != phillyPriority(opt, row) {
			t.Fatal("not a function of the row")
		}
		counts[p]++
	}
	for class, share := range map[string]float64{"high": 0.10, "low": 0.20, "medium": 0.70} {
		got := float64(counts[class]) / n
		if got < share-0.015 || got > share+0.015 {
			t.Errorf("%s: share %.3f, want about %.2f", class, got, share)
		}
	}
	other := PhillyOptions{Seed: 4}.withDefaults()
	same := 0
	for row := uint64(1); row <= 1000; row++ {
		if phillyPriority(opt, row) == phillyPriority(other, row) {
			same++
		}
	}
	if same > 700 {
		t.Fatalf("seeds 3 and 4 agree on %d of 1000 rows: the seed does not drive the rule", same)
	}
}

func TestReadCSV(t *testing.T) {
	in := `# start: 2026-03-01T08:00:00Z
submit_s,duration_s,gpus,team,priority,queue
30,600,8,vision,high,high_perf
0.5,60.25,1,nlp,,
`
	tr, err := ReadCSV(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Job{
		{ID: "j000001", Submit: utc("2026-03-01T08:00:00Z").Add(500 * time.Millisecond), Duration: 60250 * time.Millisecond, GPUs: 1, Team: "nlp", Priority: "medium", Queue: "default"},
		{ID: "j000002", Submit: utc("2026-03-01T08:00:30Z"), Duration: 10 * time.Minute, GPUs: 8, Team: "vision", Priority: "high", Queue: "high_perf"},
	}
	if diff := cmp.Diff(want, tr.Jobs); diff != "" {
		t.Fatalf("jobs (-want +got):\n%s", diff)
	}

	var buf bytes.Buffer
	if err := WriteCSV(&buf, tr); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCSV(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(tr.Jobs, back.Jobs); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
}

func TestReadCSVErrors(t *testing.T) {
	head := CSVHeader + "\n"
	for name, in := range map[string]string{
		"wrong header":      "submit,duration\n",
		"negative submit":   head + "-1,10,1,a,,\n",
		"zero duration":     head + "1,0,1,a,,\n",
		"no team":           head + "1,10,1,,,\n",
		"bad gpus":          head + "1,10,x,a,,\n",
		"bad start line":    "# start: yesterday\n" + head,
		"too few columns":   head + "1,10,1\n",
		"not a number":      head + "1,ten,1,a,,\n",
		"infinite duration": head + "1,Inf,1,a,,\n",
	} {
		if _, err := ReadCSV(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestDeclaredTimeout(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{
		time.Second:                  15 * time.Minute,
		15 * time.Minute:             15 * time.Minute,
		15*time.Minute + time.Second: 30 * time.Minute,
		5 * time.Hour:                8 * time.Hour,
		25 * time.Hour:               48 * time.Hour,
		61 * 24 * time.Hour:          61 * 24 * time.Hour,
		61*24*time.Hour + 1:          62 * 24 * time.Hour,
	} {
		if got := DeclaredTimeout(d); got != want {
			t.Errorf("DeclaredTimeout(%s) = %s, want %s", d, got, want)
		}
		if DeclaredTimeout(d) < d {
			t.Errorf("DeclaredTimeout(%s) cuts the job short", d)
		}
	}
}

func TestShape(t *testing.T) {
	for _, c := range []struct{ gpus, node, per, nodes int }{
		{1, 8, 1, 1}, {8, 8, 8, 1}, {16, 8, 8, 2}, {12, 8, 6, 2}, {24, 8, 8, 3}, {128, 8, 8, 16}, {5, 4, 3, 2},
	} {
		per, n := Shape(c.gpus, c.node)
		if per != c.per || n != c.nodes {
			t.Errorf("Shape(%d, %d) = %d×%d, want %d×%d", c.gpus, c.node, n, per, c.nodes, c.per)
		}
	}
}

func TestWindowAndParseTime(t *testing.T) {
	la, _ := time.LoadLocation(PhillyZone)
	from, err := ParseTime("2017-10-01", la)
	if err != nil {
		t.Fatal(err)
	}
	if !from.Equal(utc("2017-10-01T07:00:00Z")) {
		t.Fatalf("2017-10-01 in Los Angeles is %s", from.UTC())
	}
	if _, err := ParseTime("October", la); err == nil {
		t.Fatal("a bad date parsed")
	}
	tr := &Trace{Location: la, Jobs: []Job{{ID: "a", Submit: from.Add(-time.Second)}, {ID: "b", Submit: from}, {ID: "c", Submit: from.Add(time.Hour)}}}
	w := tr.Window(from, from.Add(time.Hour))
	if len(w.Jobs) != 1 || w.Jobs[0].ID != "b" {
		t.Fatalf("window [from, to) kept %v", w.Jobs)
	}
}

func TestTraceValidate(t *testing.T) {
	tr := &Trace{Jobs: []Job{{ID: "x", Team: "a b", Queue: "default", Priority: "medium"}}}
	err := tr.Validate(map[string]bool{"default": true}, map[string]bool{"medium": true})
	if err == nil || !strings.Contains(err.Error(), "team") {
		t.Fatalf("bad team name: %v", err)
	}
	tr.Jobs[0].Team, tr.Jobs[0].Queue = "a", "gpu"
	if err := tr.Validate(map[string]bool{"default": true}, map[string]bool{"medium": true}); err == nil || !strings.Contains(err.Error(), "queue") {
		t.Fatalf("unknown queue: %v", err)
	}
}
