package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// decodeJSONStrict reads one JSON value as encoding/json would into an
// any (numbers as json.Number), but refuses an object that names a key
// twice: encoding/json keeps the last, so two readers of one body could
// disagree on what it says.
func decodeJSONStrict(doc []byte) (any, error) {
	// The usual document is well formed, nested a few levels and names
	// each key once: encoding/json reads it whole, several times faster
	// than token by token, and keysOnce proves it strict. Anything else
	// goes the token way, which finds the first problem and names its
	// path; both ways give the same value (FuzzDecodeJSONStrict).
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err == nil && len(bytes.TrimLeft(doc[dec.InputOffset():], " \t\n\r")) == 0 && keysOnce(doc) {
		return v, nil
	}
	return decodeJSONTokens(doc)
}

// decodeJSONTokens is decodeJSONStrict token by token: it stops at the
// first problem (syntax, depth, size, a repeated key) with its path.
func decodeJSONTokens(doc []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	budget := maxNodes
	v, err := jsonValue(dec, "", 0, &budget)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one document")
	}
	return v, nil
}

func jsonValue(dec *json.Decoder, path string, depth int, budget *int) (any, error) {
	if depth > maxDepth {
		return nil, errors.New("nested too deeply")
	}
	if *budget--; *budget < 0 {
		return nil, errors.New("document has too many values")
	}
	tok, err := dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			out := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				at := k
				if path != "" {
					at = path + "." + k
				}
				if _, dup := out[k]; dup {
					return nil, fmt.Errorf("key %q appears twice", at)
				}
				v, err := jsonValue(dec, at, depth+1, budget)
				if err != nil {
					return nil, err
				}
				out[k] = v
			}
			_, err := dec.Token() // '}'
			return out, err
		case '[':
			out := []any{}
			for i := 0; dec.More(); i++ {
				v, err := jsonValue(dec, fmt.Sprintf("%s[%d]", path, i), depth+1, budget)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token() // ']'
			return out, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil
	}
}

// CheckJSON reports whether doc is one well-formed JSON value whose
// objects name no key twice. Handlers call it before json.Unmarshal.
func CheckJSON(doc []byte) error {
	if json.Valid(doc) && keysOnce(doc) {
		return nil
	}
	_, err := decodeJSONTokens(doc)
	return err
}

// endsScalar reports whether c ends a number, true, false or null.
func endsScalar(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', ']', '}':
		return true
	}
	return false
}

// keysOnce reports whether doc, one well-formed JSON value (json.Valid),
// is within maxDepth and maxNodes and names no key twice in any object.
// False sends the document to decodeJSONTokens for the error; true must
// mean decodeJSONTokens would accept it.
func keysOnce(doc []byte) bool {
	type frame struct {
		object bool
		keys   int                 // where this object's keys start in keys
		big    map[string]struct{} // its keys, once there are many
	}
	var (
		stackBuf [16]frame
		keysBuf  [32][]byte
	)
	stack, keys := stackBuf[:0], keysBuf[:0]
	values := 0
	// value counts one value at the current depth, as jsonValue does.
	value := func() bool {
		values++
		return values <= maxNodes && len(stack) <= maxDepth
	}
	wantKey := false
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; c {
		case ' ', '\t', '\n', '\r', ':':
		case ',':
			wantKey = len(stack) > 0 && stack[len(stack)-1].object
		case '{', '[':
			if !value() {
				return false
			}
			stack = append(stack, frame{object: c == '{', keys: len(keys)})
			wantKey = c == '{'
		case '}', ']':
			keys = keys[:stack[len(stack)-1].keys]
			stack = stack[:len(stack)-1]
			wantKey = false
		case '"':
			start, escaped := i+1, false
			for i++; doc[i] != '"'; i++ {
				if doc[i] == '\\' {
					escaped = true
					i++
				}
			}
			if !wantKey {
				if !value() {
					return false
				}
				continue
			}
			wantKey = false
			k := doc[start:i]
			if escaped || !utf8.Valid(k) {
				// Compare keys as encoding/json reads them.
				var dk string
				if json.Unmarshal(doc[start-1:i+1], &dk) != nil {
					return false
				}
				k = []byte(dk)
			}
			f := &stack[len(stack)-1]
			if f.big != nil {
				if _, dup := f.big[string(k)]; dup {
					return false
				}
				f.big[string(k)] = struct{}{}
				continue
			}
			for _, o := range keys[f.keys:] {
				if string(o) == string(k) {
					return false
				}
			}
			keys = append(keys, k)
			if len(keys)-f.keys > 16 {
				// Many keys: a set instead of a scan per key.
				f.big = make(map[string]struct{}, 2*(len(keys)-f.keys))
				for _, o := range keys[f.keys:] {
					f.big[string(o)] = struct{}{}
				}
				keys = keys[:f.keys]
			}
		default:
			// A number, true, false or null: skip to its end.
			if !value() {
				return false
			}
			for i+1 < len(doc) && !endsScalar(doc[i+1]) {
				i++
			}
		}
	}
	return true
}
