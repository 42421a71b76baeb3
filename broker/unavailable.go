package broker

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrUnavailable marks an error of the store itself (a full disk, a lost
// connection) as opposed to one about the request: the API answers it
// with 503 and Retry-After, and the same call may succeed later.
var ErrUnavailable = errors.New("store unavailable")

// IsStoreFailure reports whether err is the store failing rather than the
// request being wrong: ErrUnavailable, an I/O or network error, a closed
// or timed-out store, a Redis that refuses or is loading.
func IsStoreFailure(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	var re interface{ RedisError() }
	switch {
	case errors.Is(err, ErrUnavailable),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EIO),
		errors.Is(err, syscall.EROFS), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, berrors.ErrDatabaseNotOpen), errors.Is(err, berrors.ErrTimeout),
		errors.Is(err, berrors.ErrDatabaseReadOnly),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		errors.As(err, &ne), errors.As(err, &re):
		return true
	}
	return false
}

// IsStoreUnreachable reports whether err is a store failure of reaching
// the store (a refused, reset or closed connection, a timeout), as against
// the store refusing the work (a full disk, a read-only file, an I/O
// error, a Redis error reply). A store that answers again is past the
// first kind, not the second: only a write that goes through shows that.
func IsStoreUnreachable(err error) bool {
	if !IsStoreFailure(err) {
		return false
	}
	var re interface{ RedisError() }
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EIO) ||
		errors.Is(err, syscall.EROFS) || errors.Is(err, berrors.ErrDatabaseReadOnly) || errors.As(err, &re) {
		return false
	}
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) || errors.As(err, &ne)
}
