package burst

import (
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

// TestOfferBudgetSkipAgreesWithDecide: when OfferBudgetSkip says a priced
// offer cannot be launched (no global budget, or it is spent), Decide
// refuses the job with CodeBudget; with room in the budget it says
// nothing and Decide launches. Leased capacity is never skipped for the
// budget.
func TestOfferBudgetSkipAgreesWithDecide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		budgets map[string]Budget
		skip    bool
	}{
		{"no global budget", map[string]Budget{}, true},
		{"spent", map[string]Budget{broker.GlobalScope: {Limit: usd("500"), Committed: usd("500")}}, true},
		{"room", map[string]Budget{broker.GlobalScope: {Limit: usd("500"), Committed: usd("100")}}, false},
	} {
		in := input(80, mk("a").obj())
		in.Budgets = tc.budgets
		for _, o := range in.Offers {
			code, detail := OfferBudgetSkip(in, o)
			if (code == SkipBudget) != tc.skip || (tc.skip && !strings.Contains(detail, "global")) {
				t.Errorf("%s: OfferBudgetSkip(%s) = %q %q", tc.name, o.Key(), code, detail)
			}
		}
		d := Decide(in)
		if refused := d.Reasons["a"].Code == CodeBudget; refused != tc.skip || (!tc.skip && len(d.Launches) != 1) {
			t.Errorf("%s: Decide reasons %+v, %d launches", tc.name, d.Reasons, len(d.Launches))
		}
		leased := providers.Offer{Provider: "colo", InstanceType: "box-1", GPUs: 8, PricePerHour: usd("8.80"), Prepaid: true, Available: true}
		if code, _ := OfferBudgetSkip(in, leased); code != "" {
			t.Errorf("%s: leased capacity skipped for the budget", tc.name)
		}
	}
}
