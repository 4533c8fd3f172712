package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestPrintJSONContract: durations become *_ms (numbers under them
// converted), key order stays, URLs keep their &, times are RFC 3339.
func TestPrintJSONContract(t *testing.T) {
	at := time.Date(2026, 11, 23, 4, 5, 6, 0, time.UTC)
	v := struct {
		URL     string                   `json:"url"`
		Elapsed time.Duration            `json:"elapsed_ns"`
		Phases  map[string]time.Duration `json:"phases_ns"`
		Timings map[string]int64         `json:"timings_us"`
		Size    int64                    `json:"size_bytes"`
		Started time.Time                `json:"started"`
		Nested  []struct {
			TTL time.Duration `json:"ttl_ns"`
		} `json:"nested"`
	}{
		URL:     "postgresql://u@/db?host=/tmp&port=5432",
		Elapsed: 1500 * time.Microsecond,
		Phases:  map[string]time.Duration{"copy": 2 * time.Second},
		Timings: map[string]int64{"start": 250},
		Size:    1 << 40,
		Started: at,
		Nested: []struct {
			TTL time.Duration `json:"ttl_ns"`
		}{{TTL: time.Minute}},
	}
	var out bytes.Buffer
	if err := printJSON(&out, v); err != nil {
		t.Fatal(err)
	}
	want := `{
  "url": "postgresql://u@/db?host=/tmp&port=5432",
  "elapsed_ms": 1.5,
  "phases_ms": {
    "copy": 2000
  },
  "timings_ms": {
    "start": 0.25
  },
  "size_bytes": 1099511627776,
  "started": "2026-11-23T04:05:06Z",
  "nested": [
    {
      "ttl_ms": 60000
    }
  ]
}
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	checkContract(t, "printJSON", out.Bytes())
}

var (
	badDurationKey = regexp.MustCompile(`(_ns|_us|_sec|_secs|_seconds|_nanos|_micros|_millis)$`)
	sizeWord       = regexp.MustCompile(`(^|_)(size|mb|kb|gb|mib|kib|gib)($|_)`)
	looksLikeTime  = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[T ]\d{2}:`)
)

// checkContract walks a --json document and reports every key or value
// that breaks docs/cli.md.
func checkContract(t *testing.T, what string, doc []byte) {
	t.Helper()
	for _, esc := range []string{`\u0026`, `\u003c`, `\u003e`} {
		if bytes.Contains(doc, []byte(esc)) {
			t.Errorf("%s: HTML-escaped %s in the output", what, esc)
		}
	}
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Errorf("%s: not JSON: %v\n%s", what, err, doc)
		return
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if badDurationKey.MatchString(k) {
					t.Errorf("%s: %s.%s: durations are *_ms", what, path, k)
				}
				if sizeWord.MatchString(k) && !strings.HasSuffix(k, "_bytes") {
					t.Errorf("%s: %s.%s: sizes are *_bytes", what, path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		case string:
			if looksLikeTime.MatchString(x) {
				if _, err := time.Parse(time.RFC3339, x); err != nil {
					t.Errorf("%s: %s = %q: timestamps are RFC 3339", what, path, x)
				}
			}
		}
	}
	walk("", v)
}

// TestJSONContractOfCommands runs every command whose --json output needs
// no running server or root-only set-up and checks it against docs/cli.md,
// errors included.
func TestJSONContractOfCommands(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	writeTree(t, src, 3, 1000)
	pgBin := testenv.PGBinDirs(t)[0]
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"doctor", base}, 0},
		{[]string{"doctor", testenv.XFSDir(t)}, 0},
		{[]string{"pg", "ls", "--pg-bin", pgBin}, 0},
		{[]string{"ls"}, 0},
		{[]string{"template", "ls"}, 0},
		{[]string{"copy", src, filepath.Join(base, "dst")}, 0},
		{[]string{"copy", "--sync", "none", "--method", "copy", src, filepath.Join(base, "dst2")}, 0},
		{[]string{"copy", filepath.Join(base, "missing"), filepath.Join(base, "dst3")}, exitNotFound},
		{[]string{"down", "no-such-cluster"}, exitNotFound},
	} {
		r := runInProcess(t, append(c.args, "--json")...)
		what := "pgfork " + strings.Join(c.args, " ") + " --json"
		if r.code != c.code {
			t.Errorf("%s: exit %d, want %d\n%s%s", what, r.code, c.code, r.stdout, r.stderr)
			continue
		}
		doc := r.stdout
		if c.code != 0 {
			doc = r.stderr // {"error", "kind", "hint"}
		}
		if strings.TrimSpace(doc) == "" {
			t.Errorf("%s: no output", what)
			continue
		}
		checkContract(t, what, []byte(doc))
	}
	_ = os.RemoveAll(filepath.Join(base, "dst"))
}
