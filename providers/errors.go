package providers

import (
	"errors"
	"fmt"
)

// Error kinds. Every error a provider returns for a failed API call wraps
// exactly one of these (through *Error), chosen from the API's error code by
// a table in the provider's package, never from the message text.
var (
	// ErrInsufficientCapacity: the provider has no machines of this offer
	// right now. Try the next offer.
	ErrInsufficientCapacity = errors.New("insufficient capacity")
	// ErrQuotaExceeded: the account's limit would be passed. Try another
	// provider or region; tell an operator.
	ErrQuotaExceeded = errors.New("quota exceeded")
	// ErrUnsupported: this offer cannot be launched as asked (type not in
	// this zone, spot not offered, price ceiling too low).
	ErrUnsupported = errors.New("offer unsupported")
	// ErrNotFound: the machine does not exist (any more).
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized: the credentials are missing, wrong, or lack a
	// permission.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrInvalidRequest: the request itself is wrong (a bad record id, an
	// offer this provider never made, a malformed parameter).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrHostKeyMismatch: the machine presented an SSH host key that the
	// provider does not vouch for. Nothing was run on it; delete it.
	ErrHostKeyMismatch = errors.New("ssh host key mismatch")
	// ErrUnavailable: the provider's API failed in a way that may pass
	// (server error, throttling). Retry later.
	ErrUnavailable = errors.New("provider unavailable")
)

// Error is a failed provider call: its kind (one of the Err* values), the
// provider, the operation, and the API's own error code.
type Error struct {
	Kind     error  // one of the Err* kinds above
	Provider string // "aws", "gcp", "lambda", …
	Op       string // "create", "delete", …
	Code     string // the API's code: "InsufficientInstanceCapacity", …
	Err      error  // the underlying error, if any
}

// Error reads "aws create: insufficient capacity (InsufficientInstanceCapacity): …".
func (e *Error) Error() string {
	s := fmt.Sprintf("%s %s: %v", e.Provider, e.Op, e.Kind)
	if e.Code != "" {
		s += " (" + e.Code + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap exposes both the kind and the cause to errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// NewError builds an *Error of the given kind.
func NewError(kind error, provider, op, code string, err error) error {
	return &Error{Kind: kind, Provider: provider, Op: op, Code: code, Err: err}
}

// CodeTable maps an API's error codes onto error kinds.
type CodeTable map[string]error

// Map returns the *Error for an API error code: the table's kind, or
// fallback when the code is not in the table.
func (t CodeTable) Map(provider, op, code string, fallback error, err error) error {
	kind, ok := t[code]
	if !ok {
		kind = fallback
	}
	return NewError(kind, provider, op, code, err)
}

// Code returns the API error code carried by err, or "".
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// IsInsufficientCapacity reports whether err says the offer has no capacity.
func IsInsufficientCapacity(err error) bool { return errors.Is(err, ErrInsufficientCapacity) }

// IsQuotaExceeded reports whether err says an account limit was hit.
func IsQuotaExceeded(err error) bool { return errors.Is(err, ErrQuotaExceeded) }

// IsNotFound reports whether err says the machine does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsUnauthorized reports whether err says the credentials were refused.
func IsUnauthorized(err error) bool { return errors.Is(err, ErrUnauthorized) }

// IsHostKeyMismatch reports whether err says the machine's host key was not
// one the provider vouches for.
func IsHostKeyMismatch(err error) bool { return errors.Is(err, ErrHostKeyMismatch) }

// IsNextOffer reports whether a Create failure means "this offer cannot be
// had now; try the next one": capacity, quota or an unsupported offer.
func IsNextOffer(err error) bool {
	return errors.Is(err, ErrInsufficientCapacity) || errors.Is(err, ErrQuotaExceeded) || errors.Is(err, ErrUnsupported)
}

// ConfigError is one bad field of a provider's config section. Field is
// relative to the section ("region", "instanceTypes[0]"); the broker's
// config check puts the section's path in front
// ("providers[0].aws.region").
type ConfigError struct {
	Field   string
	Message string
}

func (e *ConfigError) Error() string { return e.Field + ": " + e.Message }

// ConfigErrors collects a section's ConfigErrors; Err joins them (nil when
// none).
type ConfigErrors []error

// Add records that field breaks the rule in format.
func (c *ConfigErrors) Add(field, format string, args ...any) {
	*c = append(*c, &ConfigError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Err is the joined errors, or nil.
func (c ConfigErrors) Err() error { return errors.Join(c...) }
