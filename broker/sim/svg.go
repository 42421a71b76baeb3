package sim

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// Chart geometry, in SVG user units.
const (
	chartWidth  = 1000
	panelHeight = 190
	marginLeft  = 60
	marginRight = 60
	panelTop    = 28
	plotHeight  = 130
	maxPoints   = 500
)

// WriteChart draws one panel per policy: on-prem GPUs busy and burst GPUs
// (left axis) and queue depth (right axis) over time, from hourly means.
func WriteChart(w io.Writer, r *Report) error {
	bw := bufio.NewWriter(w)
	height := 40 + panelHeight*len(r.Results)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="%d" y="18" font-size="13">%d jobs from %s; %d on-prem GPUs. `+
		`<tspan fill="#1f77b4">on-prem GPUs busy</tspan>, <tspan fill="#ff7f0e">burst GPUs</tspan> (left axis), `+
		`<tspan fill="#7f7f7f">queue depth in jobs</tspan> (right axis); hourly means</text>`+"\n",
		marginLeft, r.Trace.Jobs, r.Trace.From.Format("2006-01-02"), r.Cluster.OnPremGPUs)
	// One scale for every panel, so policies compare at a glance.
	gpuMax, queueMax, hours := float64(r.Cluster.OnPremGPUs), 1.0, 1
	for _, res := range r.Results {
		s := res.Series
		hours = max(hours, len(s.OnPremBusy))
		for i := range s.OnPremBusy {
			gpuMax = math.Max(gpuMax, math.Max(s.OnPremBusy[i], s.BurstGPUs[i]))
			queueMax = math.Max(queueMax, s.Queue[i])
		}
	}
	gpuMax, queueMax = niceCeil(gpuMax), niceCeil(queueMax)
	start := time.Time{}
	if len(r.Results) > 0 {
		start = r.Results[0].Series.Start
	}
	for i, res := range r.Results {
		top := 40 + i*panelHeight
		panel(bw, res, top, hours, gpuMax, queueMax, float64(r.Cluster.OnPremGPUs), start)
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

func panel(w *bufio.Writer, res *Result, top, hours int, gpuMax, queueMax, capacity float64, start time.Time) {
	x0, x1 := float64(marginLeft), float64(chartWidth-marginRight)
	y0 := float64(top + panelTop + plotHeight)
	fmt.Fprintf(w, `<text x="%d" y="%d" font-size="12" font-weight="bold">%s</text>`+"\n", marginLeft, top+16, html.EscapeString(res.Policy))
	fmt.Fprintf(w, `<text x="%d" y="%d" fill="#555">wait p95 %s · JCT mean %s · burst %.0f GPU-h (%s× fluid) · %s %s</text>`+"\n",
		marginLeft+260, top+16, human(res.Wait.P95), human(res.JCT.Mean), res.BurstGPUHours, ratio(res.BurstOverFluid),
		fmt.Sprintf("%.0f", money(res.BurstCost)), res.Currency)
	fmt.Fprintf(w, `<rect x="%.0f" y="%d" width="%.0f" height="%d" fill="none" stroke="#ccc"/>`+"\n", x0, top+panelTop, x1-x0, plotHeight)
	// Axes: GPUs on the left, jobs on the right, days below.
	for k := 0; k <= 2; k++ {
		v := gpuMax * float64(k) / 2
		y := y0 - plotHeight*float64(k)/2
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" text-anchor="end" fill="#1f77b4">%.0f</text>`+"\n", x0-4, y+4, v)
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" fill="#7f7f7f">%.0f</text>`+"\n", x1+4, y+4, queueMax*float64(k)/2)
	}
	days := float64(hours) / 24
	step := math.Max(1, niceCeil(days/10))
	for d := 0.0; d <= days; d += step {
		x := x0 + (x1-x0)*d*24/float64(hours)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/>`+"\n", x, y0, x, y0-plotHeight)
		fmt.Fprintf(w, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", x, y0+13,
			start.Add(time.Duration(d*24)*time.Hour).Format("01-02"))
	}
	// The on-prem capacity, dashed.
	yc := y0 - plotHeight*math.Min(capacity/gpuMax, 1)
	fmt.Fprintf(w, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#1f77b4" stroke-dasharray="4 3" stroke-width="0.8"/>`+"\n", x0, yc, x1, yc)
	line := func(vals []float64, scale float64, color string, width float64) {
		pts := downsample(vals, maxPoints)
		if len(pts) == 0 {
			return
		}
		var b strings.Builder
		for k, v := range pts {
			x := x0 + (x1-x0)*(float64(k)+0.5)*float64(len(vals))/float64(len(pts))/float64(hours)
			y := y0 - plotHeight*math.Min(v/scale, 1)
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>`+"\n", color, width, strings.TrimSpace(b.String()))
	}
	line(res.Series.Queue, queueMax, "#7f7f7f", 0.8)
	line(res.Series.OnPremBusy, gpuMax, "#1f77b4", 1.2)
	line(res.Series.BurstGPUs, gpuMax, "#ff7f0e", 1.2)
}

// downsample averages vals into at most n buckets.
func downsample(vals []float64, n int) []float64 {
	if len(vals) <= n {
		return vals
	}
	per := (len(vals) + n - 1) / n
	out := make([]float64, 0, n)
	for i := 0; i < len(vals); i += per {
		end := min(i+per, len(vals))
		s := 0.0
		for _, v := range vals[i:end] {
			s += v
		}
		out = append(out, s/float64(end-i))
	}
	return out
}

// niceCeil rounds x up to 1, 2 or 5 times a power of ten.
func niceCeil(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}
