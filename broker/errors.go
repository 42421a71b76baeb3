package broker

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors shared by the store implementations and the API.
var (
	// ErrNotFound: the record does not exist (or the caller may not see it).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the change does not apply to the record's current state.
	ErrConflict = errors.New("conflict")
	// ErrFenced: the store refused a write from a broker that no longer
	// holds the leader lease.
	ErrFenced = errors.New("fenced: this broker is no longer the leader")
)

// Error codes carried in FieldError.Code.
const (
	CodeRequired     = "required"
	CodeUnknownField = "unknown_field"
	CodeWrongType    = "wrong_type"
	CodeOutOfRange   = "out_of_range"
	CodeTooLong      = "too_long"
	CodeInvalid      = "invalid_value"
	CodeNotAllowed   = "not_allowed"
	CodeTooLarge     = "too_large"
	CodeMalformed    = "malformed"
)

// FieldError is one rejected field: its path in the document (e.g.
// "resources.gpus", "command[0]", "env.FOO"), a code, and the rule broken.
type FieldError struct {
	Field   string `json:"field"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e FieldError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

// ValidationError is every FieldError found in one document, in field order.
type ValidationError struct {
	Errors []FieldError
}

func (e *ValidationError) Error() string {
	if len(e.Errors) == 1 {
		return e.Errors[0].Error()
	}
	parts := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		parts[i] = fe.Error()
	}
	return fmt.Sprintf("%d problems: %s", len(e.Errors), strings.Join(parts, "; "))
}

// First returns the first problem, which the API reports as the error.
func (e *ValidationError) First() FieldError { return e.Errors[0] }

// add records a problem.
func (e *ValidationError) add(field, code, format string, args ...any) {
	e.Errors = append(e.Errors, FieldError{Field: field, Code: code, Message: fmt.Sprintf(format, args...)})
}

func (e *ValidationError) err() error {
	if e == nil || len(e.Errors) == 0 {
		return nil
	}
	return e
}

// AsValidation returns the ValidationError inside err, if any.
func AsValidation(err error) (*ValidationError, bool) {
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve, true
	}
	var fe FieldError
	if errors.As(err, &fe) {
		return &ValidationError{Errors: []FieldError{fe}}, true
	}
	return nil, false
}
