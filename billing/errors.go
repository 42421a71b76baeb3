package billing

import "errors"

// Sentinel errors of the billing package. Callers test them with errors.Is;
// the wrapping message says which field or entry broke the rule.
var (
	// ErrInvalidEntry: a ledger entry breaks one of the invariants listed
	// on Entry. Stores refuse such entries.
	ErrInvalidEntry = errors.New("invalid ledger entry")
	// ErrInvalidConfig: the billing configuration cannot be used.
	ErrInvalidConfig = errors.New("invalid billing config")
	// ErrNoRate: no price was in force for some GPU-time. The meter still
	// records the time (at rate 0) and reports the problem; it never drops
	// hours.
	ErrNoRate = errors.New("no rate in force")
	// ErrMixedCurrency: a report or a budget sum met entries in more than
	// one currency; amounts in different currencies are never added.
	ErrMixedCurrency = errors.New("entries in more than one currency")
	// ErrBadQuery: a report or export request is malformed (unknown
	// dimension, empty period, unknown format).
	ErrBadQuery = errors.New("bad billing query")
	// ErrNotMetered: an export was asked for a period the meter has not yet
	// finished; exporting it now would give a different file later.
	ErrNotMetered = errors.New("period not fully metered yet")
)
