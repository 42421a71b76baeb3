package billing

import (
	"fmt"
	"slices"
	"time"
)

// Price is a rate per GPU-hour in force from an instant on.
type Price struct {
	// From is when the price takes effect (inclusive). The zero time means
	// "since always".
	From time.Time `json:"from"`
	// PerGPUHour is the price of one GPU for one hour.
	PerGPUHour Amount `json:"perGPUHour"`
}

// PriceSchedule is a list of prices ordered by From, strictly increasing.
// Each price holds until the next one's From. Rate changes apply from their
// effective time only: the meter splits a slice at every From inside it and
// prices each part at the price in force at the part's start, and the
// ledger is never repriced.
type PriceSchedule []Price

// FlatPrice is a schedule with one price since always: how a cloud instance
// (the offer's price at launch) or a fixed lease is priced.
func FlatPrice(perGPUHour Amount) PriceSchedule {
	return PriceSchedule{{PerGPUHour: perGPUHour}}
}

// InstancePrice divides the price of a whole machine per hour over its GPUs,
// rounded half up to a micro: 98.32 USD/h for 8 GPUs is 12.29 USD per
// GPU-hour.
func InstancePrice(perInstanceHour Amount, gpus int) (Amount, error) {
	if gpus <= 0 {
		return 0, fmt.Errorf("divide instance price: %d GPUs", gpus)
	}
	if perInstanceHour < 0 {
		return 0, fmt.Errorf("divide instance price: negative price %s", perInstanceHour)
	}
	return perInstanceHour.MulDiv(1, int64(gpus)), nil
}

// Validate checks order and signs.
func (s PriceSchedule) Validate() error {
	for i, p := range s {
		if p.PerGPUHour < 0 {
			return fmt.Errorf("price %d: negative price %s", i, p.PerGPUHour)
		}
		if i > 0 && !s[i-1].From.Before(p.From) {
			return fmt.Errorf("price %d: from %s is not after the previous price's %s", i, p.From.Format(time.RFC3339), s[i-1].From.Format(time.RFC3339))
		}
	}
	return nil
}

// At returns the price in force at t; false when t is before the first
// price (or the schedule is empty).
func (s PriceSchedule) At(t time.Time) (Amount, bool) {
	i, _ := slices.BinarySearchFunc(s, t, func(p Price, t time.Time) int { return p.From.Compare(t) })
	// i is the first price with From >= t.
	if i < len(s) && s[i].From.Equal(t) {
		return s[i].PerGPUHour, true
	}
	if i == 0 {
		return 0, false
	}
	return s[i-1].PerGPUHour, true
}

// nextChange returns the first From strictly after t, or false.
func (s PriceSchedule) nextChange(t time.Time) (time.Time, bool) {
	i, found := slices.BinarySearchFunc(s, t, func(p Price, t time.Time) int { return p.From.Compare(t) })
	if found {
		i++
	}
	if i < len(s) {
		return s[i].From, true
	}
	return time.Time{}, false
}

// RateTable holds the operators' amortised on-prem rates per GPU model.
type RateTable struct {
	// ByModel maps a GPU model ("H100") to its price schedule.
	ByModel map[string]PriceSchedule
	// Default prices models that ByModel does not list; empty means such
	// GPU-time is metered at rate 0 and reported as ErrNoRate.
	Default PriceSchedule
}

// For returns the schedule for a GPU model.
func (r RateTable) For(model string) PriceSchedule {
	if s, ok := r.ByModel[model]; ok {
		return s
	}
	return r.Default
}

// Validate checks every schedule.
func (r RateTable) Validate() error {
	for _, m := range sortedKeys(r.ByModel) {
		if err := r.ByModel[m].Validate(); err != nil {
			return fmt.Errorf("rates %s: %w", m, err)
		}
	}
	if err := r.Default.Validate(); err != nil {
		return fmt.Errorf("default rate: %w", err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
