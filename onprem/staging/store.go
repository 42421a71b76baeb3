package staging

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// ErrNotFound is returned when an object (or every object under a prefix)
// does not exist.
var ErrNotFound = errors.New("object not found")

// Object is one object of a store.
type Object struct {
	Key  string
	Size int64
	// ETag identifies the object's content as the store sees it.
	ETag string
}

// Store is the part of an object store that staging uses. S3 and GCS (XML
// API) implement all of it; https implements Head and Get.
type Store interface {
	// List returns the objects whose key starts with prefix.
	List(ctx context.Context, bucket, prefix string) ([]Object, error)
	// Head returns one object's size and ETag, or ErrNotFound.
	Head(ctx context.Context, bucket, key string) (Object, error)
	// Get opens one object, or returns ErrNotFound.
	Get(ctx context.Context, bucket, key string) (io.ReadCloser, error)
	// Put writes one object of size bytes from r.
	Put(ctx context.Context, bucket, key string, r io.ReadSeeker, size int64) error
	// Delete removes objects; missing ones are not an error.
	Delete(ctx context.Context, bucket string, keys []string) error
}

// S3Config says how to reach an S3-compatible store.
type S3Config struct {
	// Endpoint overrides the AWS endpoint (an S3-compatible server, or GCS
	// at https://storage.googleapis.com).
	Endpoint string `json:"endpoint,omitempty"`
	// Region of the buckets; "us-east-1" when empty ("auto" for GCS).
	Region string `json:"region,omitempty"`
	// PathStyle addresses buckets as endpoint/bucket instead of
	// bucket.endpoint (most S3-compatible servers want it).
	PathStyle bool `json:"pathStyle,omitempty"`
	// AccessKeyEnv and SecretKeyEnv name environment variables holding a
	// static key pair (GCS HMAC keys); empty: the default credential chain
	// (environment, shared config, instance role).
	AccessKeyEnv string `json:"accessKeyEnv,omitempty"`
	SecretKeyEnv string `json:"secretKeyEnv,omitempty"`
	// CredentialsFile is a shared credentials file (the format of
	// ~/.aws/credentials) to read instead of the default locations.
	CredentialsFile string `json:"credentialsFile,omitempty"`
}

// GCSEndpoint is Google Cloud Storage's S3-compatible XML API.
const GCSEndpoint = "https://storage.googleapis.com"

// NewS3 builds a Store over aws-sdk-go-v2's S3 client.
func NewS3(ctx context.Context, c S3Config) (Store, error) {
	region := c.Region
	if region == "" {
		region = "us-east-1"
	}
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(region)}
	if c.AccessKeyEnv != "" {
		ak, sk := os.Getenv(c.AccessKeyEnv), os.Getenv(c.SecretKeyEnv)
		if ak == "" || sk == "" {
			return nil, fmt.Errorf("staging: %s and %s must both be set", c.AccessKeyEnv, c.SecretKeyEnv)
		}
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(ak, sk, "")))
	}
	if c.CredentialsFile != "" {
		opts = append(opts, awsconfig.WithSharedCredentialsFiles([]string{c.CredentialsFile}), awsconfig.WithSharedConfigProfile("default"))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("staging: load AWS config: %w", err)
	}
	return &s3Store{c: s3.NewFromConfig(cfg, func(o *s3.Options) {
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(c.Endpoint)
		}
		o.UsePathStyle = c.PathStyle
		// Checksums only when the operation needs one: S3-compatible
		// servers (GCS among them) reject the newer trailing checksums.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})}, nil
}

type s3Store struct{ c *s3.Client }

func isNotFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var nsb *types.NoSuchBucket
	if errors.As(err, &nsk) || errors.As(err, &nf) || errors.As(err, &nsb) {
		return true
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NotFound", "NoSuchBucket", "404":
			return true
		}
	}
	return false
}

func (s *s3Store) List(ctx context.Context, bucket, prefix string) ([]Object, error) {
	var out []Object
	p := s3.NewListObjectsV2Paginator(s.c, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			if isNotFound(err) {
				return nil, ErrNotFound
			}
			return nil, err
		}
		for _, o := range page.Contents {
			out = append(out, Object{Key: aws.ToString(o.Key), Size: aws.ToInt64(o.Size), ETag: strings.Trim(aws.ToString(o.ETag), `"`)})
		}
	}
	return out, nil
}

func (s *s3Store) Head(ctx context.Context, bucket, key string) (Object, error) {
	h, err := s.c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		if isNotFound(err) {
			return Object{}, ErrNotFound
		}
		return Object{}, err
	}
	return Object{Key: key, Size: aws.ToInt64(h.ContentLength), ETag: strings.Trim(aws.ToString(h.ETag), `"`)}, nil
}

func (s *s3Store) Get(ctx context.Context, bucket, key string) (io.ReadCloser, error) {
	o, err := s.c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		if isNotFound(err) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	return o.Body, nil
}

func (s *s3Store) Put(ctx context.Context, bucket, key string, r io.ReadSeeker, size int64) error {
	_, err := s.c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: r, ContentLength: aws.Int64(size)})
	return err
}

func (s *s3Store) Delete(ctx context.Context, bucket string, keys []string) error {
	for _, k := range keys {
		if _, err := s.c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(k)}); err != nil && !isNotFound(err) {
			return err
		}
	}
	return nil
}

// httpsStore downloads public or pre-signed https:// objects.
type httpsStore struct{ c *http.Client }

func (h httpsStore) url(host, key string) string { return "https://" + host + "/" + key }

func (h httpsStore) List(ctx context.Context, host, prefix string) ([]Object, error) {
	o, err := h.Head(ctx, host, prefix)
	if err != nil {
		return nil, err
	}
	return []Object{o}, nil
}

func (h httpsStore) Head(ctx context.Context, host, key string) (Object, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, h.url(host, key), nil)
	if err != nil {
		return Object{}, err
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return Object{}, err
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return Object{}, ErrNotFound
	case resp.StatusCode/100 != 2:
		return Object{}, fmt.Errorf("HEAD %s: %s", h.url(host, key), resp.Status)
	}
	size, _ := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64)
	etag := strings.Trim(resp.Header.Get("ETag"), `"`)
	if etag == "" {
		etag = resp.Header.Get("Last-Modified")
	}
	return Object{Key: key, Size: size, ETag: etag}, nil
}

func (h httpsStore) Get(ctx context.Context, host, key string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.url(host, key), nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		resp.Body.Close()
		return nil, ErrNotFound
	case resp.StatusCode/100 != 2:
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", h.url(host, key), resp.Status)
	}
	return resp.Body, nil
}

func (httpsStore) Put(context.Context, string, string, io.ReadSeeker, int64) error {
	return errors.New("https:// locations are read-only; write outputs and checkpoints to s3:// or gs://")
}

func (httpsStore) Delete(context.Context, string, []string) error {
	return errors.New("https:// locations are read-only")
}
