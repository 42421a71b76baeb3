package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/billing"
)

// GlobalScope is the budget scope of the whole cluster; every other scope
// is a team name.
const GlobalScope = "global"

// ErrBudgetExceeded: a reservation would take a scope past its limit.
var ErrBudgetExceeded = errors.New("burst budget exceeded")

// Budget is a monthly burst budget for one scope, in the billing currency.
type Budget struct {
	Scope     string         `json:"scope"`
	Limit     billing.Amount `json:"limit"`
	Currency  string         `json:"currency"`
	UpdatedAt time.Time      `json:"updatedAt"`
	UpdatedBy string         `json:"updatedBy"`
}

// BudgetMonth is one scope's burst money in one calendar month.
type BudgetMonth struct {
	Scope string `json:"scope"`
	Month string `json:"month"` // YYYY-MM in the billing time zone
	// Spent is kept equal to the cost of the month's cloud and lease
	// ledger entries charged to the scope (every team's, for global).
	Spent billing.Amount `json:"spent"`
	// Reserved is kept equal to the sum of Remaining() over the scope's
	// open reservations made in this month.
	Reserved billing.Amount `json:"reserved"`
}

// Committed is what the month has used or promised.
func (m BudgetMonth) Committed() billing.Amount { return m.Spent + m.Reserved }

// Reservation holds budget for one burst machine before it launches: its
// projected cost, settled by the ledger as the machine is metered.
type Reservation struct {
	ID    string `json:"id"` // the machine's record id
	Team  string `json:"team"`
	Month string `json:"month"`
	// Amount is the projected cost reserved at launch.
	Amount billing.Amount `json:"amount"`
	// Settled is the actual cost metered for the machine so far.
	Settled billing.Amount `json:"settled"`
	Open    bool           `json:"open"`
}

// Remaining is the part of the reservation not yet covered by actual cost.
func (r Reservation) Remaining() billing.Amount {
	if !r.Open || r.Settled >= r.Amount {
		return 0
	}
	return r.Amount - r.Settled
}

// AuditRecord is one change an operator made, kept forever.
type AuditRecord struct {
	At     time.Time `json:"at"`
	By     string    `json:"by"`
	Action string    `json:"action"` // e.g. budget.set
	Target string    `json:"target"`
	Old    string    `json:"old"`
	New    string    `json:"new"`
	// The call that made the change (the audit middleware's records):
	// the caller's role, the request, its answer and where it came from.
	Role   string `json:"role,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Status int    `json:"status,omitempty"`
	Remote string `json:"remote,omitempty"`
}

func budgetKey(scope string) string                  { return "limit/" + scope }
func monthKey(month, scope string) string            { return "month/" + month + "/" + scope }
func reservationKey(id string) string                { return "res/" + id }
func monthOf(t time.Time, loc *time.Location) string { return t.In(loc).Format("2006-01") }

// GetBudget reads a scope's budget; ok is false when none is set.
func GetBudget(tx Tx, scope string) (Budget, bool, error) {
	var b Budget
	err := getJSON(tx, BucketBudgets, budgetKey(scope), &b)
	if errors.Is(err, ErrNotFound) {
		return b, false, nil
	}
	return b, err == nil, err
}

// ListBudgets returns every budget, global first then by team.
func ListBudgets(tx Tx) ([]Budget, error) {
	var out []Budget
	err := tx.Scan(BucketBudgets, "limit/", PrefixEnd("limit/"), func(_ string, v []byte) error {
		var b Budget
		if err := json.Unmarshal(v, &b); err != nil {
			return err
		}
		if b.Scope == GlobalScope {
			out = append([]Budget{b}, out...)
		} else {
			out = append(out, b)
		}
		return nil
	})
	return out, err
}

// SetBudget sets (or with a negative limit, refuses) a scope's monthly
// budget and records who changed it from what to what.
func SetBudget(tx Tx, scope string, limit billing.Amount, currency, by string, now time.Time) (Budget, error) {
	if limit < 0 {
		return Budget{}, &ValidationError{Errors: []FieldError{{Field: "limit", Code: CodeOutOfRange, Message: "must not be negative"}}}
	}
	old, had, err := GetBudget(tx, scope)
	if err != nil {
		return Budget{}, err
	}
	b := Budget{Scope: scope, Limit: limit, Currency: currency, UpdatedAt: now, UpdatedBy: by}
	if err := putJSON(tx, BucketBudgets, budgetKey(scope), b); err != nil {
		return Budget{}, err
	}
	oldS := "unset"
	if had {
		oldS = old.Limit.String() + " " + old.Currency
	}
	return b, Audit(tx, AuditRecord{At: now, By: by, Action: "budget.set", Target: scope, Old: oldS, New: limit.String() + " " + currency})
}

// Audit appends a record to the audit log.
func Audit(tx Tx, r AuditRecord) error {
	return putJSON(tx, BucketAudit, fmt.Sprintf("%020d/%s/%s", r.At.UnixNano(), r.Action, r.Target), r)
}

// ListAudit returns audit records in time order.
func ListAudit(tx Tx) ([]AuditRecord, error) {
	var out []AuditRecord
	err := tx.Scan(BucketAudit, "", "", func(_ string, v []byte) error {
		var r AuditRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

// GetBudgetMonth reads a scope's totals for a month (zero when none).
func GetBudgetMonth(tx Tx, month, scope string) (BudgetMonth, error) {
	m := BudgetMonth{Scope: scope, Month: month}
	err := getJSON(tx, BucketBudgets, monthKey(month, scope), &m)
	if errors.Is(err, ErrNotFound) {
		err = nil
	}
	return m, err
}

func putBudgetMonth(tx Tx, m BudgetMonth) error {
	return putJSON(tx, BucketBudgets, monthKey(m.Month, m.Scope), m)
}

// GetReservation reads a machine's reservation.
func GetReservation(tx Tx, id string) (Reservation, error) {
	var r Reservation
	err := getJSON(tx, BucketBudgets, reservationKey(id), &r)
	return r, err
}

// Reserve holds amount for machine id against the team's and the global
// budget of the month of now, in one transaction: it fails with
// ErrBudgetExceeded, changing nothing, if either would go past its limit.
// A scope without a budget has no limit, except the global scope, which
// must be set for anything to burst. Reserving twice for one id is a
// no-op.
func Reserve(tx Tx, id, team string, amount billing.Amount, now time.Time, loc *time.Location) (Reservation, error) {
	if r, err := GetReservation(tx, id); err == nil {
		return r, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Reservation{}, err
	}
	month := monthOf(now, loc)
	for _, scope := range []string{team, GlobalScope} {
		b, ok, err := GetBudget(tx, scope)
		if err != nil {
			return Reservation{}, err
		}
		if !ok {
			if scope == GlobalScope {
				return Reservation{}, fmt.Errorf("%w: no global burst budget is set", ErrBudgetExceeded)
			}
			continue
		}
		m, err := GetBudgetMonth(tx, month, scope)
		if err != nil {
			return Reservation{}, err
		}
		if m.Committed()+amount > b.Limit {
			return Reservation{}, fmt.Errorf("%w: %s at %s/%s %s this month, %s more needed", ErrBudgetExceeded,
				scope, m.Committed().Cents(), b.Limit.Cents(), b.Currency, amount.Cents())
		}
	}
	r := Reservation{ID: id, Team: team, Month: month, Amount: amount, Open: true}
	for _, scope := range []string{team, GlobalScope} {
		m, err := GetBudgetMonth(tx, month, scope)
		if err != nil {
			return Reservation{}, err
		}
		m.Reserved += amount
		if err := putBudgetMonth(tx, m); err != nil {
			return Reservation{}, err
		}
	}
	return r, putJSON(tx, BucketBudgets, reservationKey(id), r)
}

// adjustReserved moves a reservation's remaining amount in its month's
// totals (team and global) by delta.
func adjustReserved(tx Tx, r Reservation, delta billing.Amount) error {
	if delta == 0 {
		return nil
	}
	for _, scope := range []string{r.Team, GlobalScope} {
		m, err := GetBudgetMonth(tx, r.Month, scope)
		if err != nil {
			return err
		}
		m.Reserved += delta
		if err := putBudgetMonth(tx, m); err != nil {
			return err
		}
	}
	return nil
}

// Release closes a machine's reservation: what the ledger has not covered
// goes back to the budget. Releasing twice, or an unknown id, is a no-op.
func Release(tx Tx, id string) error {
	r, err := GetReservation(tx, id)
	if errors.Is(err, ErrNotFound) || (err == nil && !r.Open) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := adjustReserved(tx, r, -r.Remaining()); err != nil {
		return err
	}
	r.Open = false
	return putJSON(tx, BucketBudgets, reservationKey(id), r)
}

// Rereserve moves machine id's reservation to a new amount (its next
// offer's projected cost): the old one is released and dropped, the new
// one made as Reserve makes it, in the caller's transaction. A zero
// amount (prepaid capacity) only releases.
func Rereserve(tx Tx, id, team string, amount billing.Amount, now time.Time, loc *time.Location) error {
	if err := Release(tx, id); err != nil {
		return err
	}
	if err := tx.Delete(BucketBudgets, reservationKey(id)); err != nil {
		return err
	}
	if amount == 0 {
		return nil
	}
	_, err := Reserve(tx, id, team, amount, now, loc)
	return err
}

// BudgetMonthKey is the month a time falls in, in the billing zone: the
// key of BudgetMonth and of reservations ("2026-12").
func BudgetMonthKey(t time.Time, loc *time.Location) string { return monthOf(t, loc) }

// Settle books one new ledger entry of a burst machine: its cost becomes
// spend of its team and the cluster in the entry's month, and covers that
// much of the machine's reservation. The broker's ledger settles each
// entry it appends (Ledger.Budgets); the simulator settles the entries it
// meters into its in-memory store.
func Settle(tx Tx, e billing.Entry, loc *time.Location) error {
	return SettleAll(tx, []billing.Entry{e}, loc)
}

// SettleAll settles entries in one transaction; the store ends as if
// Settle had settled them one by one, in order. Each budget month and
// reservation is read and written once, however many entries touch it:
// the spend and the reservations' cover only add up. The simulator
// settles each meter pass with it (a pass is thousands of entries on a
// busy replay).
func SettleAll(tx Tx, entries []billing.Entry, loc *time.Location) error {
	type monthScope struct{ month, scope string }
	type change struct{ spent, reserved billing.Amount }
	var months []monthScope
	changes := map[monthScope]*change{}
	at := func(month, scope string) *change {
		k := monthScope{month, scope}
		c := changes[k]
		if c == nil {
			c = &change{}
			changes[k] = c
			months = append(months, k)
		}
		return c
	}
	var reservations []*Reservation
	byID := map[string]*Reservation{} // nil: none for that machine
	for _, e := range entries {
		if e.Pool.Kind == billing.PoolOnPrem || e.Cost == 0 {
			continue
		}
		month := monthOf(e.Start, loc)
		for _, scope := range []string{e.Team, GlobalScope} {
			at(month, scope).spent += e.Cost
		}
		if e.Pool.InstanceID == "" {
			continue
		}
		r, seen := byID[e.Pool.InstanceID]
		if !seen {
			got, err := GetReservation(tx, e.Pool.InstanceID)
			switch {
			case errors.Is(err, ErrNotFound):
			case err != nil:
				return err
			default:
				r = &got
				reservations = append(reservations, r)
			}
			byID[e.Pool.InstanceID] = r
		}
		if r == nil {
			continue
		}
		before := r.Remaining()
		r.Settled += e.Cost
		if delta := r.Remaining() - before; delta != 0 {
			for _, scope := range []string{r.Team, GlobalScope} {
				at(r.Month, scope).reserved += delta
			}
		}
	}
	for _, k := range months {
		m, err := GetBudgetMonth(tx, k.month, k.scope)
		if err != nil {
			return err
		}
		c := changes[k]
		m.Spent += c.spent
		m.Reserved += c.reserved
		if err := putBudgetMonth(tx, m); err != nil {
			return err
		}
	}
	for _, r := range reservations {
		if err := putJSON(tx, BucketBudgets, reservationKey(r.ID), r); err != nil {
			return err
		}
	}
	return nil
}
