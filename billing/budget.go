package billing

import (
	"context"
	"fmt"
	"time"
)

// Spend is what burst capacity (cloud and lease pools, overhead included)
// cost in one calendar month.
type Spend struct {
	Month    Period
	Currency string
	// ByTeam is the cost charged to each team; overhead charged to the
	// overhead account appears under that account's name.
	ByTeam map[string]Amount
	// Total is kept equal to the sum of ByTeam.
	Total Amount
}

// Team returns what team spent (0 when nothing).
func (s Spend) Team(team string) Amount { return s.ByTeam[team] }

// BurstSpend sums the cost of burst entries (Pool.Kind cloud or lease)
// whose Start falls in the calendar month holding t, cut in loc (the
// budgets' time zone; UTC when nil), for every team in one scan. The burst
// controller reads budget spend from it: s.Team("nlp") against the team's
// budget, s.Total against the global one.
func BurstSpend(ctx context.Context, s Store, t time.Time, loc *time.Location) (Spend, error) {
	sp := Spend{Month: MonthOf(t, loc), ByTeam: map[string]Amount{}}
	err := s.Scan(ctx, sp.Month.From, sp.Month.To, func(e Entry) error {
		if !e.Pool.Kind.Burst() {
			return nil
		}
		if err := sameCurrency(&sp.Currency, e); err != nil {
			return err
		}
		sp.ByTeam[e.Team] += e.Cost
		sp.Total += e.Cost
		return nil
	})
	if err != nil {
		return Spend{}, fmt.Errorf("sum burst spend: %w", err)
	}
	return sp, nil
}
