package staging_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spillway-dev/spillway/onprem/staging"
	"github.com/spillway-dev/spillway/onprem/staging/s3server"
)

// newStager starts versitygw with bucket "data" and a Stager reaching it
// through the SDK's default credential chain, as an agent would.
func newStager(t *testing.T, cacheBytes int64) (*staging.Stager, *s3server.Server) {
	t.Helper()
	srv := s3server.Start(t)
	srv.Bucket("data")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	st, err := staging.New(context.Background(), staging.Config{
		S3:       staging.S3Config{Endpoint: srv.Endpoint, PathStyle: true},
		CacheDir: t.TempDir(), CacheBytes: cacheBytes,
		Retry: staging.Retry{Attempts: 50, Backoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st, srv
}

func put(t *testing.T, srv *s3server.Server, key string, body []byte) {
	t.Helper()
	_, err := srv.Client().PutObject(t.Context(), &s3.PutObjectInput{Bucket: aws.String("data"), Key: aws.String(key), Body: bytes.NewReader(body)})
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func get(t *testing.T, srv *s3server.Server, key string) ([]byte, error) {
	t.Helper()
	o, err := srv.Client().GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String("data"), Key: aws.String(key)})
	if err != nil {
		return nil, err
	}
	defer o.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(o.Body)
	return b.Bytes(), err
}

func random(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func TestInputsAreStagedAndTheSecondJobReadsTheCache(t *testing.T) {
	st, srv := newStager(t, 1<<30)
	a, b := random(300_000), random(5000)
	put(t, srv, "sets/v1/a.bin", a)
	put(t, srv, "sets/v1/sub/b.bin", b)
	put(t, srv, "model.pt", []byte("weights"))
	inputs := []staging.Input{{From: "s3://data/sets/v1/", To: "dataset"}, {From: "s3://data/model.pt", To: "ckpt/"}}

	var last staging.Progress
	job1 := t.TempDir()
	res, err := st.StageInputs(t.Context(), inputs, job1, func(p staging.Progress) { last = p })
	if err != nil {
		t.Fatal(err)
	}
	if res.Hits != 0 || res.Objects != 3 || last.Done != last.Total || last.Total != int64(len(a)+len(b)+7) {
		t.Fatalf("first stage: %+v, progress %+v", res, last)
	}
	for p, want := range map[string][]byte{"dataset/a.bin": a, "dataset/sub/b.bin": b, "ckpt/model.pt": []byte("weights")} {
		got, err := os.ReadFile(filepath.Join(job1, p))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %v (%d bytes)", p, err, len(got))
		}
	}
	res2, err := st.StageInputs(t.Context(), inputs, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Hits != 3 || res2.BytesRead != 0 {
		t.Fatalf("second stage read the store: %+v", res2)
	}
	stats := st.Cache().Stats()
	if stats.Hits != 3 || stats.Misses != 3 || stats.HitRatio() != 0.5 {
		t.Fatalf("cache stats %+v", stats)
	}
	// A new version of an object is a new cache entry, not a stale hit.
	put(t, srv, "model.pt", []byte("weights-v2"))
	job3 := t.TempDir()
	if _, err := st.StageInputs(t.Context(), inputs[1:], job3, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(job3, "ckpt/model.pt")); string(got) != "weights-v2" {
		t.Fatalf("stale cache entry: %q", got)
	}
}

func TestAFullCacheEvictsTheLeastRecentlyUsedAndNeverFailsTheJob(t *testing.T) {
	st, srv := newStager(t, 250_000)
	for _, k := range []string{"x1", "x2", "x3"} {
		put(t, srv, k, random(100_000))
	}
	put(t, srv, "huge", random(400_000)) // bigger than the whole cache
	stage := func(key string) {
		t.Helper()
		if _, err := st.StageInputs(t.Context(), []staging.Input{{From: "s3://data/" + key, To: key}}, t.TempDir(), nil); err != nil {
			t.Fatalf("stage %s: %v", key, err)
		}
	}
	stage("x1")
	stage("x2")
	stage("x1") // x1 is now the most recently used
	stage("x3") // evicts x2
	s := st.Cache().Stats()
	if s.Bytes > 250_000 || s.Evictions != 1 || s.Objects != 2 {
		t.Fatalf("after x3: %+v", s)
	}
	hits := s.Hits
	stage("x1")
	if st.Cache().Stats().Hits != hits+1 {
		t.Fatalf("x1 was evicted instead of x2")
	}
	stage("huge") // does not fit at all: fetched around the cache
	if s := st.Cache().Stats(); s.Bytes > 250_000 {
		t.Fatalf("cache over its cap: %+v", s)
	}
}

func TestAMissingInputIsAMissingErrorWithItsURI(t *testing.T) {
	st, _ := newStager(t, 1<<20)
	for _, from := range []string{"s3://data/nope.bin", "s3://data/no/such/prefix/"} {
		_, err := st.StageInputs(t.Context(), []staging.Input{{From: from, To: "x"}}, t.TempDir(), nil)
		var me *staging.MissingError
		if !errors.As(err, &me) || me.URI != from {
			t.Fatalf("%s: got %v", from, err)
		}
	}
}

func TestOutputsAreRetriedWhileTheBucketIsUnreachable(t *testing.T) {
	st, srv := newStager(t, 1<<20)
	work := t.TempDir()
	os.MkdirAll(filepath.Join(work, "out/logs"), 0o755)
	os.WriteFile(filepath.Join(work, "out/model.bin"), []byte("final"), 0o644)
	os.WriteFile(filepath.Join(work, "out/logs/train.log"), []byte("loss 0.1"), 0o644)
	os.WriteFile(filepath.Join(work, "debug.txt"), []byte("only on success"), 0o644)
	outputs := []staging.Output{{From: "out", To: "s3://data/runs/r1/", When: staging.WhenAlways},
		{From: "debug.txt", To: "s3://data/runs/r1/debug.txt", When: staging.WhenSuccess}}

	srv.Stop()
	var retries atomic.Int32
	restarted := make(chan struct{})
	st.OnRetry = func(uri string, attempt int, err error) {
		if retries.Add(1) == 3 {
			go func() { srv.Restart(); close(restarted) }()
		}
	}
	if err := st.UploadOutputs(t.Context(), outputs, work, false, nil); err != nil {
		t.Fatalf("upload: %v", err)
	}
	<-restarted
	if retries.Load() < 3 {
		t.Fatalf("no retries while the bucket was down")
	}
	for key, want := range map[string]string{"runs/r1/model.bin": "final", "runs/r1/logs/train.log": "loss 0.1"} {
		got, err := get(t, srv, key)
		if err != nil || string(got) != want {
			t.Fatalf("%s: %v %q", key, err, got)
		}
	}
	if _, err := get(t, srv, "runs/r1/debug.txt"); err == nil {
		t.Fatalf("a when: success output was uploaded after a failure")
	}
}

func TestATruncatedCheckpointIsNeverRestored(t *testing.T) {
	st, srv := newStager(t, 1<<20)
	ctx := t.Context()
	ck := t.TempDir()
	os.WriteFile(filepath.Join(ck, "step.txt"), []byte("100"), 0o644)
	os.MkdirAll(filepath.Join(ck, "shards"), 0o755)
	os.WriteFile(filepath.Join(ck, "shards/0.pt"), random(20_000), 0o644)
	m1, err := st.SyncCheckpoint(ctx, ck, "s3://data/ckpt/job1/", 2, staging.CheckpointMeta{Job: "j1", Attempt: 1, Seq: 1})
	if err != nil || m1 == nil || len(m1.Files) != 2 {
		t.Fatalf("sync: %v %+v", err, m1)
	}
	// A second upload cut short: its files landed, its manifest did not.
	put(t, srv, "ckpt/job1/00000000000000000002/step.txt", []byte("200"))
	// A third whose manifest names a file that arrived truncated.
	os.WriteFile(filepath.Join(ck, "step.txt"), []byte("300"), 0o644)
	if _, err := st.SyncCheckpoint(ctx, ck, "s3://data/ckpt/job1/", 5, staging.CheckpointMeta{Seq: 3}); err != nil {
		t.Fatal(err)
	}
	put(t, srv, "ckpt/job1/00000000000000000003/shards/0.pt", random(100))

	dir := filepath.Join(t.TempDir(), "ckpt")
	m, err := st.RestoreCheckpoint(ctx, dir, "s3://data/ckpt/job1/", nil)
	if err != nil || m == nil || m.Seq != "00000000000000000001" {
		t.Fatalf("restore: %v %+v", err, m)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "step.txt")); string(got) != "100" {
		t.Fatalf("restored step %q", got)
	}
	// Nothing there: nothing restored, no error.
	if m, err := st.RestoreCheckpoint(ctx, t.TempDir(), "s3://data/ckpt/none/", nil); m != nil || err != nil {
		t.Fatalf("empty restore: %v %+v", err, m)
	}
}

func TestCheckpointsKeepTheNewestN(t *testing.T) {
	st, srv := newStager(t, 1<<20)
	ck := t.TempDir()
	for i := 1; i <= 4; i++ {
		os.WriteFile(filepath.Join(ck, "step.txt"), []byte{byte('0' + i)}, 0o644)
		if _, err := st.SyncCheckpoint(t.Context(), ck, "s3://data/ck/", 2, staging.CheckpointMeta{Seq: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := srv.Client().ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{Bucket: aws.String("data"), Prefix: aws.String("ck/")})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, *o.Key)
	}
	want := "ck/00000000000000000003.manifest.json ck/00000000000000000003/step.txt ck/00000000000000000004.manifest.json ck/00000000000000000004/step.txt"
	if strings.Join(keys, " ") != want {
		t.Fatalf("kept %v", keys)
	}
}

func TestGSLocationsGoThroughTheS3CompatibleEndpoint(t *testing.T) {
	srv := s3server.Start(t)
	srv.Bucket("data")
	t.Setenv("TEST_GS_KEY", s3server.AccessKey)
	t.Setenv("TEST_GS_SECRET", s3server.SecretKey)
	st, err := staging.New(context.Background(), staging.Config{
		// Only gs:// is configured: s3:// would go to AWS.
		GS:       staging.S3Config{Endpoint: srv.Endpoint, PathStyle: true, Region: s3server.Region, AccessKeyEnv: "TEST_GS_KEY", SecretKeyEnv: "TEST_GS_SECRET"},
		CacheDir: t.TempDir(), CacheBytes: 1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	put(t, srv, "tok/vocab.json", []byte(`{"a":1}`))
	work := t.TempDir()
	if _, err := st.StageInputs(t.Context(), []staging.Input{{From: "gs://data/tok/vocab.json", To: "vocab.json"}}, work, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(work, "vocab.json")); string(got) != `{"a":1}` {
		t.Fatalf("got %q", got)
	}
}
