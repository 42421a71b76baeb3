package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// decodeJSONStrict reads one JSON value as encoding/json would into an
// any (numbers as json.Number), but refuses an object that names a key
// twice: encoding/json keeps the last, so two readers of one body could
// disagree on what it says.
func decodeJSONStrict(doc []byte) (any, error) {
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
	_, err := decodeJSONStrict(doc)
	return err
}
