package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewNormalizesBaseURL(t *testing.T) {
	for in, want := range map[string]struct {
		base string
		api  int
	}{
		"":                            {DefaultURL, 2},
		"http://h:5000":               {"http://h:5000", 2},
		"http://h:5000/":              {"http://h:5000", 2},
		"http://h:5000/api":           {"http://h:5000", 2},
		"http://h:5000/api/v2":        {"http://h:5000", 2},
		"http://h:5000/api/v1/":       {"http://h:5000", 1},
		"https://h/prefix/api/v1?x=1": {"https://h/prefix", 1},
		"http://[::1]:5000/api/":      {"http://[::1]:5000", 2},
	} {
		c, err := New(in)
		if err != nil {
			t.Fatalf("New(%q): %v", in, err)
		}
		if got := c.BaseURL(); got != want.base {
			t.Errorf("New(%q).BaseURL() = %q, want %q", in, got, want.base)
		}
		if got := c.APIVersion(); got != want.api {
			t.Errorf("New(%q).APIVersion() = %d, want %d", in, got, want.api)
		}
	}
	if c, _ := New("http://h:5000", WithAPIV1()); c.APIVersion() != 1 {
		t.Errorf("WithAPIV1: APIVersion() = %d, want 1", c.APIVersion())
	}
	for _, bad := range []string{"127.0.0.1:5000", "ftp://h/", "http://", "http://h:5000/%zz"} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%q): no error", bad)
		}
	}
}

// TestDecodeTestDatabase: v1's integer id and v2's token with the number.
func TestDecodeTestDatabase(t *testing.T) {
	var v1, v2 TestDatabase
	if err := json.Unmarshal([]byte(`{"id":3,"database":{"templateHash":"h","config":{"database":"p_test_h_003"}}}`), &v1); err != nil {
		t.Fatal(err)
	}
	if v1.ID != 3 || v1.Token != "" || v1.Database.TemplateHash != "h" || v1.Config().Database != "p_test_h_003" {
		t.Errorf("v1 answer decoded as %+v", v1)
	}
	if err := json.Unmarshal([]byte(`{"templateHash":"h","id":"9f86d081884c7d65","number":4,"database":{"config":{"database":"p_test_h_004"}}}`), &v2); err != nil {
		t.Fatal(err)
	}
	if v2.ID != 4 || v2.Token != "9f86d081884c7d65" || v2.TemplateHash != "h" || v2.Config().Database != "p_test_h_004" {
		t.Errorf("v2 answer decoded as %+v", v2)
	}
	for _, bad := range []string{`{"database":{}}`, `{"id":"tok"}`, `{"id":[1]}`} {
		var td TestDatabase
		if err := json.Unmarshal([]byte(bad), &td); err == nil {
			t.Errorf("%s decoded without an error: %+v", bad, td)
		}
	}
}

func TestConnectionString(t *testing.T) {
	c := DatabaseConfig{Host: "127.0.0.1", Port: 5433, Username: "u", Password: "p w'\\", Database: "db"}
	want := `host=127.0.0.1 port=5433 user=u password='p w\'\\' dbname=db sslmode=disable`
	if got := c.ConnectionString(); got != want {
		t.Errorf("ConnectionString() = %s, want %s", got, want)
	}
	c.AdditionalParams = map[string]string{"sslmode": "require", "application_name": "t"}
	want = `host=127.0.0.1 port=5433 user=u password='p w\'\\' dbname=db application_name=t sslmode=require`
	if got := c.ConnectionString(); got != want {
		t.Errorf("ConnectionString() = %s, want %s", got, want)
	}
}

func TestURL(t *testing.T) {
	for _, tc := range []struct {
		c    DatabaseConfig
		want string
	}{
		{DatabaseConfig{Host: "localhost", Port: 5432, Username: "u", Password: "p@ss/:", Database: "d"},
			"postgres://u:p%40ss%2F%3A@localhost:5432/d?sslmode=disable"},
		{DatabaseConfig{Host: "::1", Port: 5432, Username: "u", Database: "d"},
			"postgres://u@[::1]:5432/d?sslmode=disable"},
		{DatabaseConfig{Host: "/run/pg", Port: 5432, Username: "u", Database: "d", AdditionalParams: map[string]string{"sslmode": "prefer"}},
			"postgres://u@/d?host=%2Frun%2Fpg&port=5432&sslmode=prefer"},
	} {
		if got := tc.c.URL(); got != tc.want {
			t.Errorf("URL() = %s, want %s", got, tc.want)
		}
	}
}

func TestAPIErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		op     string
		status int
		body   string
		want   error
	}{
		{"InitializeTemplate", 423, `{"message":"template is already initialized"}`, ErrTemplateAlreadyInitialized},
		{"UnlockTestDatabase", 423, `{"message":"test database is in use"}`, ErrTestDatabaseInUse},
		{"GetTestDatabase", 404, `{"message":"template not found"}`, ErrTemplateNotFound},
		{"RecreateTestDatabase", 404, `{"message":"test database not found"}`, ErrTestNotFound},
		{"RecreateTestDatabase", 404, `{"message":"template not found"}`, ErrTemplateNotFound},
		{"Unlock", 404, `{"message":"no test database of template h is handed out under this id"}`, ErrTestNotFound},
		{"Recreate", 404, `{"message":"template not found"}`, ErrTemplateNotFound},
		{"GetTestDatabase", 410, `{"message":"template was just discarded"}`, ErrTemplateDiscarded},
		{"GetTestDatabase", 503, `timeout`, ErrServiceUnavailable},
		{"GetTestDatabase", 507, ``, ErrPoolFull},
		{"GetTestDatabase", 401, ``, ErrUnauthorized},
		{"GetTestDatabase", 400, `{"error":"bad hash"}`, ErrBadRequest},
	} {
		err := error(newAPIError(tc.op, tc.status, []byte(tc.body)))
		if !errors.Is(err, tc.want) {
			t.Errorf("%s %d: %v does not match %v", tc.op, tc.status, err, tc.want)
		}
	}
	if !errors.Is(newAPIError("GetTestDatabase", 503, nil), ErrManagerNotReady) {
		t.Error("503 does not match IntegreSQL's ErrManagerNotReady name")
	}
	if errors.Is(newAPIError("GetTestDatabase", 500, nil), ErrServiceUnavailable) {
		t.Error("500 matches ErrServiceUnavailable")
	}
	if e := newAPIError("X", 400, []byte(`{"error":"bad hash"}`)); e.Message != "bad hash" {
		t.Errorf("message = %q", e.Message)
	}
}

// TestTemplateHashVector pins the hash of a fixed tree; the Python client's
// tests pin the same value, so both clients share templates.
func TestTemplateHashVector(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("001_init.sql", "CREATE TABLE t (id int);\n")
	write("002_seed.sql", "INSERT INTO t VALUES (1);\n")
	write("sub/x.txt", "x")
	write(".hidden", "ignored")
	write(".git/HEAD", "ignored")

	const want = "932859cbf397b84d815ddae7c844e733"
	got, err := TemplateHash(dir, "v1")
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("TemplateHash = %s, want %s", got, want)
	}
	if len(got) != 32 {
		t.Errorf("len = %d, want 32", len(got))
	}

	same, _ := TemplateHash(dir, "v1")
	otherKey, _ := TemplateHash(dir, "v2")
	write(".hidden", "changed")
	dotChanged, _ := TemplateHash(dir, "v1")
	write("002_seed.sql", "INSERT INTO t VALUES (2);\n")
	contentChanged, _ := TemplateHash(dir, "v1")
	if err := os.Rename(filepath.Join(dir, "sub/x.txt"), filepath.Join(dir, "sub/y.txt")); err != nil {
		t.Fatal(err)
	}
	renamed, _ := TemplateHash(dir, "v1")
	empty, _ := TemplateHash("", "")
	if same != got || dotChanged != got {
		t.Error("hash is not stable or depends on dot files")
	}
	seen := map[string]string{}
	for name, h := range map[string]string{"base": got, "extra key": otherKey, "content": contentChanged, "rename": renamed, "empty": empty} {
		if prev, ok := seen[h]; ok {
			t.Errorf("%s and %s give the same hash", name, prev)
		}
		seen[h] = name
	}
	if _, err := TemplateHash(filepath.Join(dir, "missing"), ""); err == nil {
		t.Error("missing dir: no error")
	}
}

// TestBaseURLSecretsMasked (issue 32, F9): a token in the base URL's path
// (pgfork serve takes http://HOST:PORT/TOKEN/api) or userinfo, or given as
// the token, never shows in an error or when the client is printed; where
// the server is still does. No server needed: nothing listens on the port.
func TestBaseURLSecretsMasked(t *testing.T) {
	const secret = "s3cr3tT0KEN9f2c"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	at := l.Addr().String()
	l.Close()
	check := func(what, text string) {
		t.Helper()
		if strings.Contains(text, secret) {
			t.Errorf("%s shows the secret: %s", what, text)
		}
		if !strings.Contains(text, at) {
			t.Errorf("%s does not say where the server is (%s): %s", what, at, text)
		}
	}
	for _, u := range []string{"http://" + at + "/" + secret + "/api", "http://" + at + "/" + secret, "http://u:" + secret + "@" + at + "/api/v2"} {
		c, err := New(u, WithToken(secret))
		if err != nil {
			t.Fatalf("New(%s): %v", u, err)
		}
		check("the printed client", fmt.Sprintf("%v %+v %#v %s", c, c, c, c))
		_, err = c.InitializeTemplate(context.Background(), "x")
		var ue *UnreachableError
		if !errors.As(err, &ue) {
			t.Fatalf("InitializeTemplate with no server: %v, want an UnreachableError", err)
		}
		check("the unreachable error", fmt.Sprintf("%v / %+v", err, err))
	}
	for _, bad := range []string{"ftp://h/" + secret, "http://h/" + secret + "%zz", "http://u:" + secret + "@/"} {
		if _, err := New(bad); err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("New(%q): %v: want an error without the secret", bad, err)
		}
	}
	for in, want := range map[string]string{
		"http://h:5000/" + secret:                      "http://h:5000/***",
		"https://u:" + secret + "@h/x?token=" + secret: "https://***@h/***?***",
		"http://h:5000":                                "http://h:5000",
		"http://h:5000/":                               "http://h:5000",
		"nonsense " + secret:                           "***",
	} {
		if got := MaskBaseURL(in); got != want {
			t.Errorf("MaskBaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}
