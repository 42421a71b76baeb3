package broker

import (
	"bytes"
	"encoding/json"
	"reflect"
)

// Section is a part of a config document that another package owns (a
// provider's settings, the agents' runtime): the config keeps it as read,
// and the owner's type is filled by DecodeSection, with every problem
// named by its full path ("providers[0].aws.region"). It lets
// broker/config hold those sections without importing their packages.
type Section struct {
	v any
}

// decodeSpec keeps the section as decoded (DecodeStrict's hook).
func (s *Section) decodeSpec(v any) error {
	s.v = v
	return nil
}

// IsZero reports whether the section was absent (or null).
func (s Section) IsZero() bool { return s.v == nil }

// String is the section's top-level key as a string ("" when absent or
// not a string): enough for the config to cross-check names without
// knowing the owner's type.
func (s Section) String(key string) string {
	m, _ := s.v.(map[string]any)
	v, _ := m[key].(string)
	return v
}

// MarshalJSON writes the section as read.
func (s Section) MarshalJSON() ([]byte, error) { return json.Marshal(s.v) }

// UnmarshalJSON reads a section back from JSON, numbers kept exact.
func (s *Section) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	s.v = v
	return nil
}

// DecodeSection fills out (a pointer) from the section under DecodeStrict's
// rules: unknown fields and wrong types are refused, each problem named by
// path plus the field inside the section. An absent section leaves out as
// it is.
func DecodeSection(path string, s Section, out any) error {
	ve := &ValidationError{}
	decodeValue(ve, path, s.v, reflect.ValueOf(out).Elem())
	return ve.err()
}
