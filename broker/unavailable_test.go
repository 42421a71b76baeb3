package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	berrors "go.etcd.io/bbolt/errors"
)

// redisReply stands for a Redis error reply (go-redis's RedisError).
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// TestIsStoreUnreachable: failures of reaching the store are told from
// the store refusing the work, and from errors that are not the store's.
func TestIsStoreUnreachable(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err                  error
		failure, unreachable bool
	}{
		{fmt.Errorf("get logmeta: %w", dial), true, true},
		{fmt.Errorf("ping redis: %w", context.DeadlineExceeded), true, true},
		{redis.ErrClosed, true, true},
		{fmt.Errorf("commit: %w", &os.PathError{Op: "write", Path: "spillway.db", Err: syscall.ENOSPC}), true, false},
		{berrors.ErrDatabaseReadOnly, true, false},
		{fmt.Errorf("eval: %w", redisReply("OOM command not allowed when used memory > 'maxmemory'")), true, false},
		{errors.New("job not found"), false, false},
		{nil, false, false},
	} {
		if got := IsStoreFailure(c.err); got != c.failure {
			t.Errorf("IsStoreFailure(%v) = %v, want %v", c.err, got, c.failure)
		}
		if got := IsStoreUnreachable(c.err); got != c.unreachable {
			t.Errorf("IsStoreUnreachable(%v) = %v, want %v", c.err, got, c.unreachable)
		}
	}
}
