package broker

import (
	"errors"
	"strings"
	"testing"
)

// TestFinding8DuplicateJSONKeys: a spec (JSON or YAML) naming a key twice
// is refused with the key's path, not silently read as the last one.
func TestFinding8DuplicateJSONKeys(t *testing.T) {
	for _, doc := range []string{
		`{"resources": {"gpus": 1, "gpus": 4000}, "command": ["true"]}`,
		`{"command": ["true"], "command": ["rm", "-rf", "/"]}`,
		"resources: {gpus: 1}\ncommand: [\"true\"]\ncommand: [\"false\"]\n",
	} {
		_, err := ParseSpec([]byte(doc))
		var ve *ValidationError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), "appears twice") {
			t.Fatalf("%s: accepted or wrong error: %v", doc, err)
		}
	}
	if err := CheckJSON([]byte(`{"node":"a","jobs":[{"job":"x","job":"y"}]}`)); err == nil || !strings.Contains(err.Error(), `"jobs[0].job"`) {
		t.Fatalf("CheckJSON: %v", err)
	}
	if err := CheckJSON([]byte(`{"a":[1,{"b":2}],"c":"d"}`)); err != nil {
		t.Fatalf("CheckJSON refused a good document: %v", err)
	}
	if _, err := ParseSpec([]byte(`{"resources": {"gpus": 1}, "command": ["true"]}`)); err != nil {
		t.Fatalf("good spec: %v", err)
	}
}
