package api

import (
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
)

// UtilRow is one team × pool × GPU model × shift.
type UtilRow struct {
	Team     string `json:"team"`
	Pool     string `json:"pool"`
	GPUModel string `json:"gpuModel"`
	Shift    string `json:"shift"`
	UtilTotals
}

// UtilTotals are the sums of a row. The GPU-millisecond and money fields
// are exact integer shares of ledger entries: an entry that spans a shift
// change is split by time, the remainder to its last piece, so every sum
// equals the ledger's.
type UtilTotals struct {
	// GPUMillis is the GPU-time allocated, as the ledger charges it (burst
	// overhead included, under the team that pays it).
	GPUMillis int64 `json:"gpuMillis"`
	// OverheadGPUMillis is the part of GPUMillis that was burst overhead.
	OverheadGPUMillis int64 `json:"overheadGpuMillis"`
	// EffectiveGPUMillis is the GPU-time computing: allocated time scaled
	// by measured compute utilisation.
	EffectiveGPUMillis int64 `json:"effectiveGpuMillis"`
	// MeasuredGPUMillis is the allocated time telemetry covered.
	MeasuredGPUMillis int64          `json:"measuredGpuMillis"`
	Cost              billing.Amount `json:"cost"`
	// MemoryByteSeconds is GPU memory in use on the cards held, over time;
	// CardSeconds the card-time telemetry covered it on.
	MemoryByteSeconds float64 `json:"memoryByteSeconds"`
	CardSeconds       float64 `json:"cardSeconds"`

	// Derived for people.
	GPUHours          string  `json:"gpuHours"`
	ComputingGPUHours string  `json:"computingGpuHours"`
	Utilization       float64 `json:"utilization"`
	MemoryGiBHours    float64 `json:"memoryGiBHours"`
	MeanMemoryBytes   int64   `json:"meanMemoryBytes"`
}

// Add sums o into t.
func (t *UtilTotals) Add(o UtilTotals) {
	t.GPUMillis += o.GPUMillis
	t.OverheadGPUMillis += o.OverheadGPUMillis
	t.EffectiveGPUMillis += o.EffectiveGPUMillis
	t.MeasuredGPUMillis += o.MeasuredGPUMillis
	t.Cost += o.Cost
	t.MemoryByteSeconds += o.MemoryByteSeconds
	t.CardSeconds += o.CardSeconds
}

// Derive fills the fields for people from the sums.
func (t *UtilTotals) Derive() {
	t.GPUHours = billing.FormatGPUHours(t.GPUMillis)
	t.ComputingGPUHours = billing.FormatGPUHours(t.EffectiveGPUMillis)
	if t.MeasuredGPUMillis > 0 {
		t.Utilization = float64(t.EffectiveGPUMillis) / float64(t.MeasuredGPUMillis)
	}
	t.MemoryGiBHours = t.MemoryByteSeconds / 3600 / (1 << 30)
	if t.CardSeconds > 0 {
		t.MeanMemoryBytes = int64(t.MemoryByteSeconds / t.CardSeconds)
	}
}

// IdleHolder is a job that held GPU memory while its cards computed under
// the idle threshold.
type IdleHolder struct {
	Job  string `json:"job"`
	Team string `json:"team"`
	// IdleCardSeconds is card-time held idle with memory in use.
	IdleCardSeconds float64 `json:"idleCardSeconds"`
	// MeanMemoryBytes is the memory held on those cards, on average.
	MeanMemoryBytes int64     `json:"meanMemoryBytes"`
	First           time.Time `json:"first"`
	Last            time.Time `json:"last"`
}

// IdleCard is a card and how long it computed under the idle threshold.
type IdleCard struct {
	Node string `json:"node"`
	GPU  int    `json:"gpu"`
	// IdleSeconds is the card-time under the threshold in the period;
	// HeldIdleSeconds the part of it a job held the card.
	IdleSeconds     float64 `json:"idleSeconds"`
	HeldIdleSeconds float64 `json:"heldIdleSeconds"`
	// LongestIdle is the longest unbroken stretch under the threshold,
	// ending at LongestIdleEnd.
	LongestIdleSeconds float64   `json:"longestIdleSeconds"`
	LongestIdleEnd     time.Time `json:"longestIdleEnd"`
	// LastHolder is the last job seen holding the card while idle.
	LastHolder string `json:"lastHolder,omitempty"`
}

// UtilizationReport is the body of GET /v1/reports/utilization.
type UtilizationReport struct {
	Period     billing.Period    `json:"period"`
	Team       string            `json:"team,omitempty"`
	Currency   string            `json:"currency,omitempty"`
	Resolution broker.Resolution `json:"resolution"`
	// Shifts says how hours were cut: the zone, the weekday day hours and
	// the weekend days.
	Shifts ShiftRules `json:"shifts"`
	// IdleThreshold is the compute percent under which a card is idle.
	IdleThreshold int          `json:"idleThreshold"`
	Rows          []UtilRow    `json:"rows"`
	Total         UtilTotals   `json:"total"`
	IdleHolders   []IdleHolder `json:"idleHolders"`
	IdleCards     []IdleCard   `json:"idleCards"`
	// DataWaits are jobs whose GPUs waited on data in the period.
	DataWaits []DataWaitJob `json:"dataWaits"`
}

// ShiftRules echo the reports section of the config.
type ShiftRules struct {
	TimeZone string   `json:"timeZone"`
	DayStart int      `json:"dayStart"`
	DayEnd   int      `json:"dayEnd"`
	Weekend  []string `json:"weekend"`
}
