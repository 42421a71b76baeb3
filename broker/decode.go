package broker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// specHook is implemented by types that decode themselves from a generic
// JSON value (Duration, Quantity).
type specHook interface {
	decodeSpec(v any) error
}

// DecodeStrict reads a YAML or JSON document (JSON is YAML) into out, a
// pointer to a struct, and rejects anything the struct does not declare.
// Unlike encoding/json it matches field names exactly, and every problem
// carries the path of the field it is about ("resources.gpus",
// "command[2]"), so the API can tell the user which line to fix.
func DecodeStrict(doc []byte, out any) error {
	if len(bytes.TrimSpace(doc)) == 0 {
		return &ValidationError{Errors: []FieldError{{Code: CodeMalformed, Message: "the document is empty"}}}
	}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return &ValidationError{Errors: []FieldError{{Code: CodeMalformed, Message: "not valid YAML or JSON: " + cleanYAMLError(err)}}}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return &ValidationError{Errors: []FieldError{{Code: CodeMalformed, Message: "not valid YAML or JSON: " + err.Error()}}}
	}
	if dec.More() {
		return &ValidationError{Errors: []FieldError{{Code: CodeMalformed, Message: "more than one document"}}}
	}
	ve := &ValidationError{}
	decodeValue(ve, "", v, reflect.ValueOf(out).Elem())
	return ve.err()
}

func cleanYAMLError(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "error converting YAML to JSON: ")
	return strings.TrimPrefix(s, "yaml: ")
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

var hookType = reflect.TypeOf((*specHook)(nil)).Elem()

// decodeValue stores src into dst, recording problems in ve under path.
func decodeValue(ve *ValidationError, path string, src any, dst reflect.Value) {
	if src == nil {
		return // null is the same as absent
	}
	if dst.CanAddr() && dst.Addr().Type().Implements(hookType) {
		if err := dst.Addr().Interface().(specHook).decodeSpec(src); err != nil {
			ve.add(path, CodeInvalid, "%s", err.Error())
		}
		return
	}
	switch dst.Kind() {
	case reflect.Pointer:
		v := reflect.New(dst.Type().Elem())
		decodeValue(ve, path, src, v.Elem())
		dst.Set(v)
	case reflect.Struct:
		m, ok := src.(map[string]any)
		if !ok {
			ve.add(path, CodeWrongType, "must be an object, got %s", kindOf(src))
			return
		}
		fields := structFields(dst.Type())
		for _, k := range sortedKeys(m) {
			idx, ok := fields[k]
			if !ok {
				ve.add(join(path, k), CodeUnknownField, "unknown field (known: %s)", knownList(dst.Type()))
				continue
			}
			decodeValue(ve, join(path, k), m[k], dst.Field(idx))
		}
	case reflect.Map:
		m, ok := src.(map[string]any)
		if !ok {
			ve.add(path, CodeWrongType, "must be an object, got %s", kindOf(src))
			return
		}
		out := reflect.MakeMapWithSize(dst.Type(), len(m))
		for _, k := range sortedKeys(m) {
			ev := reflect.New(dst.Type().Elem()).Elem()
			decodeValue(ve, join(path, k), m[k], ev)
			out.SetMapIndex(reflect.ValueOf(k).Convert(dst.Type().Key()), ev)
		}
		dst.Set(out)
	case reflect.Slice:
		a, ok := src.([]any)
		if !ok {
			ve.add(path, CodeWrongType, "must be a list, got %s", kindOf(src))
			return
		}
		out := reflect.MakeSlice(dst.Type(), len(a), len(a))
		for i, e := range a {
			decodeValue(ve, fmt.Sprintf("%s[%d]", path, i), e, out.Index(i))
		}
		dst.Set(out)
	case reflect.String:
		s, ok := src.(string)
		if !ok {
			ve.add(path, CodeWrongType, "must be a string, got %s", kindOf(src))
			return
		}
		dst.SetString(s)
	case reflect.Bool:
		b, ok := src.(bool)
		if !ok {
			ve.add(path, CodeWrongType, "must be true or false, got %s", kindOf(src))
			return
		}
		dst.SetBool(b)
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, ok := src.(json.Number)
		if !ok {
			ve.add(path, CodeWrongType, "must be a whole number, got %s", kindOf(src))
			return
		}
		i, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil || dst.OverflowInt(i) {
			ve.add(path, CodeWrongType, "must be a whole number in range, got %s", n)
			return
		}
		dst.SetInt(i)
	case reflect.Float64:
		n, ok := src.(json.Number)
		if !ok {
			ve.add(path, CodeWrongType, "must be a number, got %s", kindOf(src))
			return
		}
		f, err := n.Float64()
		if err != nil || math.IsInf(f, 0) {
			ve.add(path, CodeWrongType, "must be a number in range, got %s", n)
			return
		}
		dst.SetFloat(f)
	default:
		ve.add(path, CodeWrongType, "cannot be set")
	}
}

func kindOf(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		if len(x) > 40 {
			x = x[:40] + "…"
		}
		return strconv.Quote(x)
	case bool:
		return strconv.FormatBool(x)
	case json.Number:
		return x.String()
	}
	return fmt.Sprintf("%T", v)
}

func structFields(t reflect.Type) map[string]int {
	out := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = i
	}
	return out
}

func knownList(t reflect.Type) string {
	fs := structFields(t)
	names := make([]string, 0, len(fs))
	for n := range fs {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
