package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
)

// PriceChange is one row of a live-price series (`spillway sim
// --prices`): from At on, the offers of Provider's InstanceType — in
// Market ("spot" or "on-demand") when set — cost Price per machine-hour.
// The simulated providers then list those offers at that price, and the
// burst decisions read them as the broker reads its providers' offers
// (Fleet.Offers, burst.Input.Offers): a launch is priced, reserved and
// metered at the price its offer had when it was decided.
type PriceChange struct {
	At           time.Time      `json:"time"`
	Provider     string         `json:"provider"`
	InstanceType string         `json:"instanceType"`
	Market       string         `json:"market,omitempty"`
	Price        billing.Amount `json:"price"`
	// Line is the row's line in its file (for errors).
	Line int `json:"-"`
}

// PricesHeader is the header of a price series in CSV.
const PricesHeader = "time,provider,instanceType,price"

// LoadPrices reads a price series file and checks it against the
// cluster's offers.
func LoadPrices(path string, c *Cluster) ([]PriceChange, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read prices: %w", err)
	}
	defer f.Close()
	ps, err := ReadPrices(f)
	if err == nil {
		err = CheckPrices(ps, c.Offers)
	}
	if err != nil {
		return nil, fmt.Errorf("prices %s: %w", path, err)
	}
	return ps, nil
}

// ReadPrices reads a price series: CSV with the header
// time,provider,instanceType,price (and optionally market), or JSON
// lines with those fields. Times are RFC 3339; prices decimal amounts in
// the cluster's currency. Blank lines and lines starting with # are
// skipped. The changes come back in time order (rows at one time in file
// order). An error names the line and the field.
func ReadPrices(r io.Reader) ([]PriceChange, error) {
	raw, err := io.ReadAll(io.LimitReader(r, 256<<20))
	if err != nil {
		return nil, err
	}
	var out []PriceChange
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var cols map[string]int
	jsonl := false
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if cols == nil && !jsonl {
			if strings.HasPrefix(text, "{") {
				jsonl = true
			} else {
				if cols, err = priceHeader(text); err != nil {
					return nil, fmt.Errorf("line %d: %w", line, err)
				}
				continue
			}
		}
		var pc PriceChange
		if jsonl {
			pc, err = priceJSON(text)
		} else {
			pc, err = priceCSV(text, cols)
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		pc.Line = line
		out = append(out, pc)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if len(out) == 0 {
		return nil, errors.New("no price rows (want the header " + PricesHeader + " and rows, or JSON lines)")
	}
	slices.SortStableFunc(out, func(a, b PriceChange) int { return a.At.Compare(b.At) })
	return out, nil
}

func priceHeader(text string) (map[string]int, error) {
	rec, err := csv.NewReader(strings.NewReader(text)).Read()
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	cols := map[string]int{}
	for i, h := range rec {
		h = strings.TrimSpace(h)
		switch h {
		case "time", "provider", "instanceType", "price", "market":
		default:
			return nil, fmt.Errorf("header: unknown column %q (want %s, and optionally market)", h, PricesHeader)
		}
		if _, dup := cols[h]; dup {
			return nil, fmt.Errorf("header: column %s twice", h)
		}
		cols[h] = i
	}
	for _, h := range strings.Split(PricesHeader, ",") {
		if _, ok := cols[h]; !ok {
			return nil, fmt.Errorf("header: no %s column (want %s)", h, PricesHeader)
		}
	}
	return cols, nil
}

func priceCSV(text string, cols map[string]int) (PriceChange, error) {
	rec, err := csv.NewReader(strings.NewReader(text)).Read()
	if err != nil {
		return PriceChange{}, err
	}
	if len(rec) != len(cols) {
		return PriceChange{}, fmt.Errorf("%d fields, the header has %d", len(rec), len(cols))
	}
	get := func(k string) string {
		if i, ok := cols[k]; ok {
			return strings.TrimSpace(rec[i])
		}
		return ""
	}
	pc := PriceChange{Provider: get("provider"), InstanceType: get("instanceType"), Market: get("market")}
	if pc.At, err = time.Parse(time.RFC3339, get("time")); err != nil {
		return PriceChange{}, fmt.Errorf("time: %q is not an RFC 3339 time like 2017-10-01T08:00:00Z", get("time"))
	}
	if pc.Price, err = billing.ParseAmount(get("price")); err != nil {
		return PriceChange{}, fmt.Errorf("price: %w", err)
	}
	return pc, checkPriceRow(pc)
}

func priceJSON(text string) (PriceChange, error) {
	var row struct {
		Time         string          `json:"time"`
		Provider     string          `json:"provider"`
		InstanceType string          `json:"instanceType"`
		Market       string          `json:"market"`
		Price        json.RawMessage `json:"price"`
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&row); err != nil {
		return PriceChange{}, fmt.Errorf("not a JSON object of time, provider, instanceType, price (and market): %w", err)
	}
	pc := PriceChange{Provider: row.Provider, InstanceType: row.InstanceType, Market: row.Market}
	var err error
	if pc.At, err = time.Parse(time.RFC3339, row.Time); err != nil {
		return PriceChange{}, fmt.Errorf("time: %q is not an RFC 3339 time like 2017-10-01T08:00:00Z", row.Time)
	}
	price := strings.Trim(string(row.Price), `"`)
	if len(row.Price) == 0 {
		return PriceChange{}, errors.New("price: is required")
	}
	if pc.Price, err = billing.ParseAmount(price); err != nil {
		return PriceChange{}, fmt.Errorf("price: %w", err)
	}
	return pc, checkPriceRow(pc)
}

func checkPriceRow(pc PriceChange) error {
	switch {
	case pc.Provider == "":
		return errors.New("provider: is required")
	case pc.InstanceType == "":
		return errors.New("instanceType: is required")
	case pc.Market != "" && pc.Market != "spot" && pc.Market != "on-demand":
		return fmt.Errorf("market: must be spot or on-demand, got %q", pc.Market)
	case pc.Price < 0:
		return errors.New("price: must not be negative")
	}
	return nil
}

// priceTargets are the indexes in offers of the offers a change prices.
func priceTargets(pc PriceChange, offers []providers.Offer) []int {
	var out []int
	for i, o := range offers {
		if o.Provider != pc.Provider || o.InstanceType != pc.InstanceType {
			continue
		}
		if pc.Market != "" && o.Spot != (pc.Market == "spot") {
			continue
		}
		out = append(out, i)
	}
	return out
}

// CheckPrices checks that every change prices offers of the cluster: one
// offer, or, with a market, that market's offers of the type.
func CheckPrices(ps []PriceChange, offers []providers.Offer) error {
	for _, pc := range ps {
		t := priceTargets(pc, offers)
		switch {
		case len(t) == 0:
			return fmt.Errorf("line %d: instanceType: no %s offer of %s %s in the cluster config", pc.Line, cmp.Or(pc.Market, "spot or on-demand"), pc.Provider, pc.InstanceType)
		case pc.Market == "" && len(t) > 1:
			return fmt.Errorf("line %d: market: %s %s is offered %d ways (spot and on-demand, or regions): add a market column", pc.Line, pc.Provider, pc.InstanceType, len(t))
		}
	}
	return nil
}

// applyPrices prices the simulated providers' offers with the changes
// due by now.
func (e *engine) applyPrices() {
	ps := e.opt.Prices
	for e.nextPrice < len(ps) && !ps[e.nextPrice].At.After(e.now) {
		for _, i := range priceTargets(ps[e.nextPrice], e.offers) {
			e.offers[i].PricePerHour = ps[e.nextPrice].Price
		}
		e.nextPrice++
	}
}
