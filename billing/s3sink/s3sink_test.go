package s3sink_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/billing/billingtest"
	"github.com/spillway-dev/spillway/billing/s3sink"
)

// fakeS3 serves gofakes3 on 127.0.0.1 and returns a real SDK client for it
// with a bucket created.
func fakeS3(t *testing.T, bucket string) (*s3.Client, billing.S3Destination) {
	t.Helper()
	srv := httptest.NewServer(gofakes3.New(s3mem.New()).Server()) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	d := billing.S3Destination{Bucket: bucket, Prefix: "spillway/", Region: "eu-central-1", Endpoint: srv.URL, PathStyle: true}
	client := s3.New(s3.Options{
		Credentials: credentials.NewStaticCredentialsProvider("test-key", "test-secret", ""),
	}, s3sink.ClientOptions(d))
	if _, err := client.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return client, d
}

func TestScheduledExportToS3EqualsTheFileExport(t *testing.T) {
	ctx := t.Context()
	client, dest := fakeS3(t, "finance")
	nov := billing.MonthOf(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.UTC)
	store := billing.NewMemStore()
	if _, err := store.Append(ctx, billingtest.Entries(11, 2000, nov, "USD")); err != nil {
		t.Fatal(err)
	}
	dec1 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	if err := store.SetWatermark(ctx, billing.MeterMark, dec1); err != nil {
		t.Fatal(err)
	}
	sched, err := billing.ParseSchedule("0 6 1 * *")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	job := func(name string, sink billing.Sink) billing.ExportJob {
		return billing.ExportJob{ScheduledExport: billing.ScheduledExport{
			Name: name, Spec: "0 6 1 * *", Schedule: sched, Period: billing.PreviousMonth,
			Format: billing.FormatCSV, Granularity: billing.GranularityHour,
		}, Sink: sink}
	}
	r := &billing.Runner{
		Store: store, Marks: store, Clock: billingtest.NewVirtualClock(dec1), Log: slog.New(slog.DiscardHandler),
		Jobs: []billing.ExportJob{
			job("to-s3", s3sink.NewWithClient(client, dest)),
			job("to-dir", billing.DirSink{Dir: dir}),
		},
		BillingAccountID: "acme",
	}
	for _, st := range r.RunDue(ctx) {
		if st.State != billing.RunOK {
			t.Fatalf("%s: %s: %v", st.Export, st.State, st.Err)
		}
	}
	obj, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("finance"), Key: aws.String("spillway/to-s3/2026-11.csv")})
	if err != nil {
		t.Fatalf("get the uploaded export: %v", err)
	}
	defer obj.Body.Close()
	got, err := io.ReadAll(obj.Body)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, "to-dir", "2026-11.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 1000 || !bytes.Equal(got, want) {
		t.Fatalf("S3 object (%d bytes) differs from the file export (%d bytes)", len(got), len(want))
	}
	if ct := aws.ToString(obj.ContentType); ct != "text/csv; charset=utf-8" {
		t.Errorf("content type %q", ct)
	}

	// Forget the run and run again: the object is replaced by the same bytes.
	if err := store.SetWatermark(ctx, billing.ExportMark("to-s3"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("finance"), Key: aws.String("spillway/to-s3/2026-11.csv"), Body: bytes.NewReader([]byte("tampered"))}); err != nil {
		t.Fatal(err)
	}
	st := r.RunDue(ctx)
	if len(st) != 1 || st[0].State != billing.RunOK || st[0].Export != "to-s3" {
		t.Fatalf("rerun = %+v", st)
	}
	again, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("finance"), Key: aws.String("spillway/to-s3/2026-11.csv")})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Body.Close()
	if b, _ := io.ReadAll(again.Body); !bytes.Equal(b, want) {
		t.Error("the rerun wrote different bytes")
	}
}

func TestPutToAMissingBucketFails(t *testing.T) {
	client, dest := fakeS3(t, "finance")
	dest.Bucket = "nope"
	err := s3sink.NewWithClient(client, dest).Put(context.Background(), "x/2026-11.csv", bytes.NewReader([]byte("a")))
	if err == nil {
		t.Fatal("put into a missing bucket succeeded")
	}
}

func TestSinkForPicksTheBackend(t *testing.T) {
	s, err := s3sink.SinkFor(t.Context(), billing.Destination{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(billing.DirSink); !ok {
		t.Errorf("dir destination gave %T", s)
	}
	if _, err := s3sink.SinkFor(t.Context(), billing.Destination{}); err == nil {
		t.Error("empty destination accepted")
	}
}
