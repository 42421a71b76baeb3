// Package location parses the object-store locations a job spec names
// (s3://, gs://, https://) and checks them against a team's allow-list.
// It has no dependencies, so the broker validates specs with it.
package location

import (
	"fmt"
	"net/url"
	"strings"
)

// Scheme is the kind of store a URI names.
type Scheme string

// Schemes a job may use.
const (
	SchemeS3    Scheme = "s3"
	SchemeGS    Scheme = "gs"
	SchemeHTTPS Scheme = "https"
)

// URI is a parsed object-store location: s3://bucket/key-or-prefix,
// gs://bucket/key-or-prefix or https://host/path.
type URI struct {
	Scheme Scheme
	// Bucket is the bucket (s3, gs) or the host (https).
	Bucket string
	// Key is the object key or prefix, without a leading slash.
	Key string
	raw string
}

// String is the URI as written.
func (u URI) String() string { return u.raw }

// Prefix is the key as a "directory": "" or ending in "/".
func (u URI) Prefix() string {
	if u.Key == "" || strings.HasSuffix(u.Key, "/") {
		return u.Key
	}
	return u.Key + "/"
}

// Parse reads an s3://, gs:// or https:// URI. The error says which rule
// the URI breaks.
func Parse(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil {
		return URI{}, fmt.Errorf("is not a URI")
	}
	switch Scheme(u.Scheme) {
	case SchemeS3, SchemeGS:
		if u.Host == "" {
			return URI{}, fmt.Errorf("names no bucket (want %s://bucket/prefix)", u.Scheme)
		}
		if !validBucket(u.Host) {
			return URI{}, fmt.Errorf("bucket %q is not a valid bucket name (3-63 lowercase letters, digits, '.', '-')", clip(u.Host))
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return URI{}, fmt.Errorf("must be %s://bucket/prefix without user, query or fragment", u.Scheme)
		}
		key := strings.TrimPrefix(u.Path, "/")
		if strings.Contains("/"+key+"/", "/../") || strings.Contains("/"+key+"/", "/./") {
			return URI{}, fmt.Errorf("key must not contain '.' or '..' segments")
		}
		return URI{Scheme: Scheme(u.Scheme), Bucket: u.Host, Key: key, raw: s}, nil
	case SchemeHTTPS:
		if u.Host == "" || u.User != nil {
			return URI{}, fmt.Errorf("must be https://host/path without user info")
		}
		return URI{Scheme: SchemeHTTPS, Bucket: u.Host, Key: strings.TrimPrefix(u.Path, "/"), raw: s}, nil
	case "":
		return URI{}, fmt.Errorf("needs a scheme: s3://, gs:// or https://")
	default:
		return URI{}, fmt.Errorf("scheme %q is not supported (s3, gs or https)", clip(u.Scheme))
	}
}

func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Allowed reports whether the URI is inside one of the allowed locations.
// An entry is "s3://bucket", "s3://bucket/prefix/", "gs://bucket" or
// "https://host"; "*" allows everything. A prefix entry matches keys under
// it only ("s3://data/nlp/" allows s3://data/nlp/x, not s3://data/nlp2).
func (u URI) Allowed(allow []string) bool {
	for _, a := range allow {
		if a == "*" {
			return true
		}
		au, err := Parse(a)
		if err != nil || au.Scheme != u.Scheme || au.Bucket != u.Bucket {
			continue
		}
		if au.Key == "" || strings.HasPrefix(u.Key, au.Prefix()) || u.Key == strings.TrimSuffix(au.Key, "/") {
			return true
		}
	}
	return false
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Join is the location of key in u's bucket.
func (u URI) Join(key string) URI {
	return URI{Scheme: u.Scheme, Bucket: u.Bucket, Key: key, raw: string(u.Scheme) + "://" + u.Bucket + "/" + key}
}
