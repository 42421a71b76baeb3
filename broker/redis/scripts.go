package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"
)

// commitScript applies a transaction's buffered writes after checking the
// fence, all in one atomic step.
//
//	KEYS[1]            the fence counter
//	KEYS[2i], [2i+1]   value key and bucket index of write i (i from 1)
//	ARGV[1]            "1" when the writer carries a token, else "0"
//	ARGV[2]            the token (decimal)
//	ARGV[3i], [3i+1], [3i+2]  "p" (put) or "d" (delete), the key, the value
var commitScript = goredis.NewScript(`
if ARGV[1] == '1' then
  local cur = redis.call('GET', KEYS[1]) or '0'
  if cur ~= ARGV[2] then
    return redis.error_reply('FENCED fence counter is ' .. cur .. ', this broker holds token ' .. ARGV[2])
  end
end
local n = (#KEYS - 1) / 2
for i = 1, n do
  local vk, ik = KEYS[2*i], KEYS[2*i + 1]
  local op, member = ARGV[3*i], ARGV[3*i + 1]
  if op == 'p' then
    redis.call('SET', vk, ARGV[3*i + 2])
    redis.call('ZADD', ik, 0, member)
  else
    redis.call('DEL', vk)
    redis.call('ZREM', ik, member)
  end
end
return n
`)

// acquireScript takes the leader lease when nobody holds it, and with it a
// new fencing token: one INCR of the counter per lease won.
//
//	KEYS[1] the lease, KEYS[2] the fence counter
//	ARGV[1] "<broker id>|<peer URL>", ARGV[2] the TTL in milliseconds
//
// It returns {token, value} when won, {0, holder's value} when held.
var acquireScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local t = redis.call('INCR', KEYS[2])
local v = t .. '|' .. ARGV[1]
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return {t, v}
`)

// renewScript extends the lease only while it still holds this broker's
// value (compare-and-PEXPIRE); 1 when renewed, 0 when lost.
var renewScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript deletes the lease only while it holds this broker's value
// (a clean step-down lets a standby take over at once).
var releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// loadScripts puts the scripts in Redis's cache so that EVALSHA (which
// also works inside MULTI) finds them.
func (s *Store) loadScripts(ctx context.Context) error {
	for _, sc := range []*goredis.Script{commitScript, acquireScript, renewScript, releaseScript} {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("load redis scripts: %w", err)
		}
	}
	return nil
}
