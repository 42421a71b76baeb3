package redis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
)

func TestParseURL(t *testing.T) {
	type want struct {
		addr, user, pass, master, sentinelPass, prefix string
		sentinels                                      []string
		db                                             int
		tls                                            bool
	}
	cases := map[string]want{
		"redis://127.0.0.1:6379/0":                             {addr: "127.0.0.1:6379"},
		"redis://:s3cret@cache:6380/2?prefix=prod":             {addr: "cache:6380", pass: "s3cret", db: 2, prefix: "prod"},
		"rediss://app:pw@cache.example:6380/1?dial_timeout=2s": {addr: "cache.example:6380", user: "app", pass: "pw", db: 1, tls: true},
		"redis-sentinel://s1:26379,s2:26379/mymaster/3?sentinel_password=sp": {master: "mymaster", db: 3, sentinelPass: "sp",
			sentinels: []string{"s1:26379", "s2:26379"}},
		"rediss-sentinel://:pw@s1:26379/m?prefix=x": {master: "m", pass: "pw", sentinels: []string{"s1:26379"}, tls: true, prefix: "x"},
	}
	for raw, w := range cases {
		tg, err := parseURL(raw)
		if err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		got := want{prefix: tg.prefix}
		if o := tg.opt; o != nil {
			got.addr, got.user, got.pass, got.db, got.tls = o.Addr, o.Username, o.Password, o.DB, o.TLSConfig != nil
		} else {
			o := tg.failover
			got.master, got.sentinels, got.sentinelPass = o.MasterName, o.SentinelAddrs, o.SentinelPassword
			got.user, got.pass, got.db, got.tls = o.Username, o.Password, o.DB, o.TLSConfig != nil
		}
		if d := cmp.Diff(w, got, cmp.AllowUnexported(want{})); d != "" {
			t.Errorf("%s (-want +got):\n%s", raw, d)
		}
	}
	for _, bad := range []string{
		"mysql://x", "redis://h:1/0?prefix=a*b", "redis://h:1/0?prefix={x}", "redis://h:1/0?bogus=1",
		"redis-sentinel://s1/m", "redis-sentinel://s1:1/", "redis-sentinel://s1:1/m/x", "redis-sentinel://s1:1/m?pool=3",
	} {
		if err := CheckURL(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestSentinel runs a real Sentinel in front of the test Redis and opens
// the store through it.
func TestSentinel(t *testing.T) {
	needRedis(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not on PATH (apt-get install -y redis-server)")
		}
		t.Skip("redis-server not on PATH (apt-get install -y redis-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	master := fmt.Sprintf("spillway-test-%d", port)
	// A long down-after keeps this Sentinel from ever acting on the shared
	// Redis; it only answers where the master is.
	os.WriteFile(conf, []byte(fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel monitor %s 127.0.0.1 6379 1
sentinel down-after-milliseconds %s 600000
`, port, dir, master, master)), 0o600)
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	prefix := testPrefix(t)
	wipeAtEnd(t, prefix)
	url := fmt.Sprintf("redis-sentinel://127.0.0.1:%d/%s/0?prefix=%s", port, master, prefix)
	var s *Store
	for deadline := time.Now().Add(5 * time.Second); ; {
		s, err = Open(context.Background(), url, Options{Logger: quiet})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "via", []byte("sentinel")) }); err != nil {
		t.Fatal(err)
	}
	direct := open(t, prefix)
	defer direct.Close()
	var got []byte
	if err := direct.View(ctx, func(tx broker.Tx) error {
		var err error
		got, err = tx.Get(broker.BucketMeta, "via")
		return err
	}); err != nil || string(got) != "sentinel" {
		t.Fatalf("written through Sentinel, read directly: %q, %v", got, err)
	}
}
