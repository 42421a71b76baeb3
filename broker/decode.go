package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	yaml "go.yaml.in/yaml/v3"
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
	v, err := parseDocument(doc)
	if err != nil {
		return &ValidationError{Errors: []FieldError{{Code: CodeMalformed, Message: "not valid YAML or JSON: " + err.Error()}}}
	}
	ve := &ValidationError{}
	decodeValue(ve, "", v, reflect.ValueOf(out).Elem())
	return ve.err()
}

// parseDocument reads one YAML 1.2 document (JSON is YAML) into the
// values encoding/json would produce, with numbers as json.Number.
// YAML 1.2 matters: under YAML 1.1 an env key N or a value no would turn
// into a boolean.
func parseDocument(doc []byte) (any, error) {
	if t := bytes.TrimSpace(doc); len(t) > 0 && t[0] == '{' {
		// JSON, the API's usual body: read it directly, a good deal faster
		// than through YAML.
		v, err := decodeJSONStrict(t)
		if err != nil {
			return nil, err
		}
		return v, nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, errors.New("more than one document")
	}
	budget := maxNodes
	return nodeValue(&root, 0, &budget)
}

// maxDepth bounds nesting and maxNodes the values a document may expand
// to, so aliases cannot multiply a small document into a huge one.
const (
	maxDepth = 64
	maxNodes = 200_000
)

func nodeValue(n *yaml.Node, depth int, budget *int) (any, error) {
	if depth > maxDepth {
		return nil, errors.New("nested too deeply")
	}
	if *budget--; *budget < 0 {
		return nil, errors.New("document expands to too many values (aliases?)")
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return nodeValue(n.Content[0], depth+1, budget)
	case yaml.AliasNode:
		return nodeValue(n.Alias, depth+1, budget)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := nodeValue(c, depth+1, budget)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				return nil, fmt.Errorf("line %d: keys must be plain strings", k.Line)
			}
			if _, dup := out[k.Value]; dup {
				return nil, fmt.Errorf("line %d: key %q appears twice", k.Line, k.Value)
			}
			v, err := nodeValue(n.Content[i+1], depth+1, budget)
			if err != nil {
				return nil, err
			}
			out[k.Value] = v
		}
		return out, nil
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, nil
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				return nil, fmt.Errorf("line %d: %v", n.Line, err)
			}
			return b, nil
		case "!!int":
			var i int64
			if err := n.Decode(&i); err != nil {
				return json.Number(n.Value), nil // out of range: let the field say so
			}
			return json.Number(strconv.FormatInt(i, 10)), nil
		case "!!float":
			var f float64
			if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return json.Number(n.Value), nil
			}
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), nil
		case "!!str":
			return n.Value, nil
		}
		return nil, fmt.Errorf("line %d: unsupported value type %s", n.Line, n.ShortTag())
	}
	return nil, fmt.Errorf("line %d: unsupported YAML node", n.Line)
}

// hasTopLevelKey reports whether a document's top-level mapping has key.
func hasTopLevelKey(doc []byte, key string) bool {
	v, err := parseDocument(doc)
	if err != nil {
		return false
	}
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	_, ok = m[key]
	return ok
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

var (
	hookType        = reflect.TypeOf((*specHook)(nil)).Elem()
	unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
)

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
	if dst.CanAddr() && dst.Kind() != reflect.Pointer && dst.Addr().Type().Implements(unmarshalerType) {
		// Types that read themselves from JSON (time.Time, money) get the
		// value back as JSON.
		raw, err := json.Marshal(src)
		if err == nil {
			err = dst.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(raw)
		}
		if err != nil {
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

// fieldCache holds structFields per type: the submit path decodes every
// spec through it, and a type's fields never change.
var fieldCache sync.Map // reflect.Type → map[string]int

// structFields maps a struct type's JSON names to field indexes. The map
// is shared: callers must not change it.
func structFields(t reflect.Type) map[string]int {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]int)
	}
	m, _ := fieldCache.LoadOrStore(t, buildStructFields(t))
	return m.(map[string]int)
}

func buildStructFields(t reflect.Type) map[string]int {
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
