package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
)

// apiError is an error with an HTTP status and the {"error": {...}} body.
type apiError struct {
	Status  int
	Code    string
	Message string
	Field   string
	Details []broker.FieldError
	// RetryAfter, when set, is sent as Retry-After (seconds).
	RetryAfter int
}

func (e *apiError) Error() string { return e.Message }

func newError(status int, code, format string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

var (
	errUnauthorized = newError(http.StatusUnauthorized, "unauthorized", "missing or unknown bearer token")
	errNotFound     = newError(http.StatusNotFound, "not_found", "not found")
)

func errForbidden(format string, args ...any) *apiError {
	return newError(http.StatusForbidden, "forbidden", format, args...)
}

func errBadRequest(field, code, format string, args ...any) *apiError {
	e := newError(http.StatusBadRequest, code, format, args...)
	e.Field = field
	return e
}

type errorBody struct {
	Error struct {
		Code    string              `json:"code"`
		Message string              `json:"message"`
		Field   string              `json:"field,omitempty"`
		Details []broker.FieldError `json:"details,omitempty"`
	} `json:"error"`
}

// errorHandler renders every error as {"error": {"code", "message",
// "field"}}; validation errors become 400s naming the first bad field and
// listing all of them in details.
func errorHandler(log *slog.Logger, noteStoreFailure func(error)) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		var body errorBody
		status := http.StatusInternalServerError
		var ae *apiError
		var he *echo.HTTPError
		ve, isValidation := broker.AsValidation(err)
		switch {
		case errors.As(err, &ae):
			status = ae.Status
			if ae.RetryAfter > 0 {
				c.Response().Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
			}
			body.Error.Code, body.Error.Message, body.Error.Field, body.Error.Details = ae.Code, ae.Message, ae.Field, ae.Details
		case isValidation:
			status = http.StatusBadRequest
			first := ve.First()
			body.Error.Code, body.Error.Message, body.Error.Field = first.Code, first.Error(), first.Field
			if len(ve.Errors) > 1 {
				body.Error.Details = ve.Errors
			}
		case errors.As(err, &he):
			status = he.Code
			body.Error.Code = http.StatusText(status)
			body.Error.Message = fmt.Sprint(he.Message)
		case errors.Is(err, broker.ErrNotFound):
			status = http.StatusNotFound
			body.Error.Code, body.Error.Message = "not_found", "not found"
		case errors.Is(err, broker.ErrFenced):
			status = http.StatusServiceUnavailable
			body.Error.Code, body.Error.Message = "not_leader", err.Error()
		case broker.IsStoreFailure(err):
			// The store failed, not the request: say when to try again.
			log.Error("store failure", "method", c.Request().Method, "path", c.Path(), "err", err)
			noteStoreFailure(err)
			status = http.StatusServiceUnavailable
			c.Response().Header().Set("Retry-After", strconv.Itoa(storeRetryAfter))
			body.Error.Code, body.Error.Message = "store_unavailable", "the broker's store is failing; nothing was changed, try again shortly"
		default:
			log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
			body.Error.Code, body.Error.Message = "internal", "internal error; the broker log has the details"
		}
		if c.Request().Method == http.MethodHead {
			_ = c.NoContent(status)
			return
		}
		_ = c.JSON(status, body)
	}
}
