package location

import "testing"

func TestParseAndAllow(t *testing.T) {
	for _, bad := range []string{"", "data/x", "ftp://h/x", "s3://", "s3://Bad_Bucket/x", "s3://data/a/../b", "s3://u@data/x", "s3://data/x?y=1"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	allow := []string{"s3://nlp-data/shared/", "gs://nlp-ckpt", "https://huggingface.co"}
	for uri, want := range map[string]bool{
		"s3://nlp-data/shared/x.bin":     true,
		"s3://nlp-data/shared":           true,
		"s3://nlp-data/shared2/x":        false,
		"s3://other/x":                   false,
		"gs://nlp-ckpt/any/thing":        true,
		"s3://nlp-ckpt/any":              false,
		"https://huggingface.co/m/x.bin": true,
		"https://evil.example/x":         false,
	} {
		u, err := Parse(uri)
		if err != nil {
			t.Fatalf("%s: %v", uri, err)
		}
		if got := u.Allowed(allow); got != want {
			t.Errorf("%s allowed=%v, want %v", uri, got, want)
		}
	}
}
