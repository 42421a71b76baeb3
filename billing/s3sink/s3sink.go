// Package s3sink puts scheduled billing exports in an S3 bucket, on AWS or
// any S3-compatible server (MinIO, Ceph RGW, …), with aws-sdk-go-v2.
package s3sink

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spillway-dev/spillway/billing"
)

// API is the one S3 call the sink makes; *s3.Client implements it.
type API interface {
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
}

// Sink writes exports as objects "<prefix><key>" in one bucket. A put of an
// existing key replaces the object, so rerunning a period is idempotent.
type Sink struct {
	api    API
	bucket string
	prefix string
}

// New builds a Sink on the AWS default credential chain (environment,
// shared config and credentials files, instance or task role), with the
// destination's region, endpoint and path-style addressing.
func New(ctx context.Context, d billing.S3Destination) (*Sink, error) {
	if d.Bucket == "" {
		return nil, fmt.Errorf("open s3 sink: empty bucket")
	}
	var opts []func(*config.LoadOptions) error
	if d.Region != "" {
		opts = append(opts, config.WithRegion(d.Region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("load aws config: %w", err)
	}
	return NewWithClient(s3.NewFromConfig(cfg, ClientOptions(d)), d), nil
}

// ClientOptions applies the destination's endpoint and addressing to an S3
// client's options.
func ClientOptions(d billing.S3Destination) func(*s3.Options) {
	return func(o *s3.Options) {
		if d.Endpoint != "" {
			o.BaseEndpoint = aws.String(d.Endpoint)
		}
		o.UsePathStyle = d.PathStyle
		if d.Region != "" {
			o.Region = d.Region
		}
	}
}

// NewWithClient builds a Sink on a given client (tests, custom transports).
func NewWithClient(api API, d billing.S3Destination) *Sink {
	return &Sink{api: api, bucket: d.Bucket, prefix: d.Prefix}
}

// Put implements billing.Sink.
func (s *Sink) Put(ctx context.Context, key string, body io.ReadSeeker) error {
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("put s3://%s/%s%s: rewind: %w", s.bucket, s.prefix, key, err)
	}
	obj := s.prefix + key
	_, err := s.api.PutObject(ctx, &s3.PutObjectInput{
		Bucket:      aws.String(s.bucket),
		Key:         aws.String(obj),
		Body:        body,
		ContentType: aws.String(contentType(key)),
	})
	if err != nil {
		return fmt.Errorf("put s3://%s/%s: %w", s.bucket, obj, err)
	}
	return nil
}

func contentType(key string) string {
	switch strings.ToLower(path.Ext(key)) {
	case ".csv":
		return "text/csv; charset=utf-8"
	case ".json":
		return "application/json"
	}
	return "application/octet-stream"
}

// SinkFor opens the sink a scheduled export's destination names: a
// billing.DirSink for dir, an S3 Sink for s3. It is how the broker wires
// Config.Exports to a billing.Runner.
func SinkFor(ctx context.Context, d billing.Destination) (billing.Sink, error) {
	switch {
	case d.Dir != "" && d.S3 == nil:
		return billing.DirSink{Dir: d.Dir}, nil
	case d.S3 != nil && d.Dir == "":
		return New(ctx, *d.S3)
	}
	return nil, fmt.Errorf("open sink: set exactly one of dir and s3")
}
