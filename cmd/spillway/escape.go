package main

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// escapeWriter passes text to a terminal with every control sequence made
// visible: job names, commands, output and error messages come from
// tenants, and a raw ESC could clear the screen, rewrite earlier lines or
// write the clipboard (OSC 52). Newlines and tabs pass; other C0 controls,
// DEL and bytes that are not UTF-8 are written as \xNN, C1 controls and
// bidirectional overrides as \uNNNN. `--raw` turns it off.
type escapeWriter struct {
	w io.Writer
	// carry holds the first bytes of a rune split across writes.
	carry []byte
}

func newEscapeWriter(w io.Writer) *escapeWriter { return &escapeWriter{w: w} }

// Write escapes p; it reports len(p) when everything was passed on.
func (e *escapeWriter) Write(p []byte) (int, error) {
	buf := append(e.carry, p...)
	e.carry = nil
	out := make([]byte, 0, len(buf)+16)
	for i := 0; i < len(buf); {
		if !utf8.FullRune(buf[i:]) {
			e.carry = append([]byte(nil), buf[i:]...)
			break
		}
		r, size := utf8.DecodeRune(buf[i:])
		out = appendEscaped(out, buf[i:i+size], r, size)
		i += size
	}
	if _, err := e.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes out a trailing partial rune (escaped byte by byte).
func (e *escapeWriter) Flush() error {
	if len(e.carry) == 0 {
		return nil
	}
	var out []byte
	for _, b := range e.carry {
		out = fmt.Appendf(out, `\x%02x`, b)
	}
	e.carry = nil
	_, err := e.w.Write(out)
	return err
}

func appendEscaped(out, raw []byte, r rune, size int) []byte {
	switch {
	case r == utf8.RuneError && size == 1:
		return fmt.Appendf(out, `\x%02x`, raw[0])
	case r == '\n' || r == '\t':
		return append(out, raw...)
	case r < 0x20 || r == 0x7f:
		return fmt.Appendf(out, `\x%02x`, r)
	case r >= 0x80 && r <= 0x9f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return fmt.Appendf(out, `\u%04x`, r)
	}
	return append(out, raw...)
}
