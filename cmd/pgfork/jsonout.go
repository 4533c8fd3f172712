package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// printJSON writes v as pgfork's --json output, following the contract in
// docs/cli.md, here and nowhere else:
//
//   - durations in milliseconds, the unit in the key: a Go time.Duration
//     marshals as nanoseconds, so a library field tagged `*_ns` (or `*_us`)
//     is written as `*_ms`, every number under it converted;
//   - sizes in bytes, keys `*_bytes` (or `bytes`), as the libraries tag them;
//   - timestamps RFC 3339 (what encoding/json writes for time.Time);
//   - no HTML escaping: a URL keeps its `&`, not `\u0026`;
//   - keys in the order the Go structs give them, indented by two spaces.
func printJSON(w io.Writer, v any) error {
	compact, err := contractJSON(v)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, compact, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

// printJSONLine is printJSON on one line: for a line in a stream that a
// program reads as it comes (`pgfork serve --json` once it answers).
func printJSONLine(w io.Writer, v any) error {
	compact, err := contractJSON(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(compact, '\n'))
	return err
}

// contractJSON is v as compact JSON following the rules of docs/cli.md
// (durations in ms, no HTML escaping).
func contractJSON(v any) ([]byte, error) {
	var raw bytes.Buffer
	enc := json.NewEncoder(&raw)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(&raw)
	dec.UseNumber()
	var compact bytes.Buffer
	if err := rewriteValue(dec, &compact, 1); err != nil {
		return nil, fmt.Errorf("--json output: %w", err)
	}
	return compact.Bytes(), nil
}

// msKey returns the key a duration field gets in the output and the factor
// that turns its numbers into milliseconds; factor 0: not a duration key.
func msKey(k string) (string, float64) {
	switch {
	case strings.HasSuffix(k, "_ns"):
		return strings.TrimSuffix(k, "_ns") + "_ms", 1e-6
	case strings.HasSuffix(k, "_us"):
		return strings.TrimSuffix(k, "_us") + "_ms", 1e-3
	}
	return k, 0
}

// rewriteValue copies one JSON value from dec to out, multiplying every
// number by scale (1 outside duration fields) and renaming duration keys.
func rewriteValue(dec *json.Decoder, out *bytes.Buffer, scale float64) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			out.WriteByte('{')
			for i := 0; dec.More(); i++ {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				k, _ := kt.(string)
				s := scale
				if nk, f := msKey(k); f != 0 {
					k, s = nk, f
				}
				if i > 0 {
					out.WriteByte(',')
				}
				writeString(out, k)
				out.WriteByte(':')
				if err := rewriteValue(dec, out, s); err != nil {
					return err
				}
			}
			out.WriteByte('}')
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := rewriteValue(dec, out, scale); err != nil {
					return err
				}
			}
			out.WriteByte(']')
		}
		_, err := dec.Token() // the closing delimiter
		return err
	case json.Number:
		if scale == 1 {
			out.WriteString(t.String())
			return nil
		}
		f, err := t.Float64()
		if err != nil {
			return err
		}
		out.WriteString(strconv.FormatFloat(f*scale, 'f', -1, 64))
	case string:
		writeString(out, t)
	case bool:
		out.WriteString(strconv.FormatBool(t))
	case nil:
		out.WriteString("null")
	}
	return nil
}

func writeString(out *bytes.Buffer, s string) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	out.Truncate(out.Len() - 1) // Encode's newline
}
