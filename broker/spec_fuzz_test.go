package broker

import "testing"

// FuzzParseSpec: no input makes the parser or the validator panic, and
// every rejection is a ValidationError that names a rule.
func FuzzParseSpec(f *testing.F) {
	f.Add([]byte(goodSpec))
	f.Add([]byte(`{"resources":{"gpus":1},"command":["true"]}`))
	f.Add([]byte("resources: {gpus: 1e309}\ncommand: [x]"))
	f.Add([]byte("a: &a [*a]"))
	f.Add([]byte("command: !!binary aGVsbG8="))
	f.Add([]byte("timeout: 9999999999999999999h\ncommand: [x]"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		s, err := ParseSpec(doc)
		if err == nil {
			s.Normalize("nlp", testLimits())
			err = s.Validate(testLimits())
		}
		if err == nil {
			return
		}
		ve, ok := AsValidation(err)
		if !ok {
			t.Fatalf("non-validation error %T: %v", err, err)
		}
		for _, fe := range ve.Errors {
			if fe.Code == "" || fe.Message == "" {
				t.Fatalf("error without code or message: %+v", fe)
			}
		}
	})
}
