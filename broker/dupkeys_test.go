package broker

import (
	"reflect"
	"strings"
	"testing"
)

// strictDocs are documents for both ways of decodeJSONStrict: good ones,
// repeated keys (plain, escaped, nested, in arrays), too deep, malformed,
// trailing data.
var strictDocs = []string{
	goodSpec,
	`{"resources":{"gpus":1},"command":["true"]}`,
	`  {"a": [1, 2.5e3, -0, true, false, null, "x\"y", {}, []]} ` + "\n",
	`{"a":1,"a":2}`,
	`{"a":1,"\u0061":2}`,
	`{"\u00e9":1,"é":2}`,
	`{"a\\":1,"a\\\\":2}`,
	`{"a\\":1,"a\\":2}`,
	`{"a":{"b":1,"c":{"b":2}},"b":3}`,
	`{"a":{"b":1,"c":{"b":2,"b":3}}}`,
	`{"jobs":[{"job":"x"},{"job":"y","job":"z"}]}`,
	`{"a":[{"k":1}],"b":{"k":2},"k":3}`,
	`{"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k18":18,"k5":19}`,
	`{"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k17":17,"k18":{"k1":1},"k19":19}`,
	strings.Repeat("[", 64) + strings.Repeat("]", 64),
	strings.Repeat("[", 65) + strings.Repeat("]", 65),
	strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70),
	`{"a":1}{"b":2}`,
	`{"a":1} x`,
	`{"a":1`,
	`{"a":}`,
	`{"a" 1}`,
	`[1,2,]`,
	`"just a string"`,
	`12`,
	`{"a":"` + "\xff" + `","` + "\xfe" + `":1,"` + "\xfd" + `":2}`,
	``,
	`   `,
}

// TestDecodeJSONStrictBothWays: the quick way (encoding/json whole, then
// keysOnce) gives what the token way gives, value or error.
func TestDecodeJSONStrictBothWays(t *testing.T) {
	for _, doc := range strictDocs {
		checkBothWays(t, []byte(doc))
	}
	// Too many values: the budget holds on the quick way too.
	many := "[" + strings.Repeat("0,", maxNodes) + "0]"
	if _, err := decodeJSONStrict([]byte(many)); err == nil || !strings.Contains(err.Error(), "too many values") {
		t.Fatalf("%d values: %v", maxNodes+1, err)
	}
	// Many keys in one object (the set, not the scan), one repeated.
	var b strings.Builder
	b.WriteString("{")
	for i := range 200 {
		b.WriteString(`"k` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `":1,`)
	}
	b.WriteString(`"kxc":2}`)
	checkBothWays(t, []byte(b.String()))
}

func checkBothWays(t *testing.T, doc []byte) {
	t.Helper()
	got, gotErr := decodeJSONStrict(doc)
	want, wantErr := decodeJSONTokens(doc)
	if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
		t.Fatalf("%.80q: error %v, the token way %v", doc, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%.80q: %#v, the token way %#v", doc, got, want)
	}
	if err := CheckJSON(doc); (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("%.80q: CheckJSON %v, the token way %v", doc, err, wantErr)
	}
}

// FuzzDecodeJSONStrict: for any input both ways agree.
func FuzzDecodeJSONStrict(f *testing.F) {
	for _, doc := range strictDocs {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) { checkBothWays(t, doc) })
}

// BenchmarkParseSpec reads the API's usual submit body.
func BenchmarkParseSpec(b *testing.B) {
	body := []byte(`{"name":"bench","project":"throughput","resources":{"gpus":1},"timeout":"1h","command":["python","train.py"]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseSpec(body); err != nil {
			b.Fatal(err)
		}
	}
}
