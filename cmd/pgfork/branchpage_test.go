package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// webDriver is the little of the WebDriver protocol the page test needs,
// spoken to chromedriver as JSON over HTTP.
type webDriver struct {
	t       *testing.T
	base    string // http://127.0.0.1:PORT/session/ID
	timeout time.Duration
}

func (d *webDriver) do(method, path string, body any) json.RawMessage {
	d.t.Helper()
	var rd *bytes.Reader
	if body == nil {
		body = map[string]any{}
	}
	b, _ := json.Marshal(body)
	rd = bytes.NewReader(b)
	if method == "GET" || method == "DELETE" {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, d.base+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("webdriver %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out struct {
		Value json.RawMessage `json:"value"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != 200 {
		d.t.Fatalf("webdriver %s %s: %d %s", method, path, resp.StatusCode, out.Value)
	}
	return out.Value
}

// find returns the element id of a CSS selector.
func (d *webDriver) find(css string) string {
	d.t.Helper()
	var el map[string]string
	_ = json.Unmarshal(d.do("POST", "/element", map[string]string{"using": "css selector", "value": css}), &el)
	for _, v := range el {
		return v
	}
	d.t.Fatalf("no element %s", css)
	return ""
}

// click clicks the element of a CSS selector in the page itself (find and
// click in one script): the page re-renders its tables when an answer comes
// back, so an element found by one webdriver call could be stale by the
// next ("stale element reference"). It waits for the element to exist.
func (d *webDriver) click(css string) {
	d.t.Helper()
	deadline := time.Now().Add(d.timeout)
	for {
		var ok bool
		_ = json.Unmarshal(d.do("POST", "/execute/sync", map[string]any{
			"script": "const e = document.querySelector(arguments[0]); if (!e) return false; e.click(); return true;",
			"args":   []any{css}}), &ok)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("no element %s to click", css)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// text is the text of the page's body.
func (d *webDriver) text() string {
	var s string
	_ = json.Unmarshal(d.do("POST", "/execute/sync", map[string]any{"script": "return document.body.innerText", "args": []any{}}), &s)
	return s
}

// waitFor waits until the page's text satisfies ok.
func (d *webDriver) waitFor(what string, ok func(string) bool) {
	d.t.Helper()
	deadline := time.Now().Add(d.timeout)
	for {
		txt := d.text()
		if ok(txt) {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("the page never showed %s; it shows:\n%s", what, txt)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tableGone says whether a connection to url succeeds and finds no table
// named name (false while the server restarts).
func tableGone(url, name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return false
	}
	defer c.Close(ctx)
	var n int
	return c.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = $1", name).Scan(&n) == nil && n == 0
}

// TestBranchPage drives the page on /ui in headless chromium (Debian's,
// through chromedriver): it lists the source, creates a branch whose
// connection string works, resets it and deletes it.
func TestBranchPage(t *testing.T) {
	driver, err := exec.LookPath("chromedriver")
	if err != nil {
		if testenv.Require() {
			t.Fatal("chromedriver is not installed (scripts/test-env.sh up installs chromium and chromium-driver)")
		}
		t.Skip("chromedriver is not installed")
	}
	bin := pgforkBinary(t)
	pgBin := testenv.PGBinDirs(t)[0]
	dir := testenv.XFSDir(t)
	src := filepath.Join(dir, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: pgBin})
	pgtest.Start(t, src, pgtest.Server{BinDir: pgBin})
	const token = "page-token-0123456789"
	s := startServe(t, bin, filepath.Join(dir, "home"), pgBin, []string{"PGFORK_TOKEN=admin-token-0123456789", "PGFORK_BRANCH_TOKENS=" + token},
		"--branch-source", "prod=cluster:"+src, "--branch-min-free", "1MiB")

	port, err := instance.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cd := exec.Command(driver, "--port="+strconv.Itoa(port))
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cd.Process.Kill(); _ = cd.Wait() })
	root := fmt.Sprintf("http://127.0.0.1:%d", port)
	for i := 0; ; i++ {
		if resp, err := http.Get(root + "/status"); err == nil {
			resp.Body.Close()
			break
		}
		if i > 600 { // a minute: a loaded machine starts it slowly
			t.Fatal("chromedriver did not answer")
		}
		time.Sleep(100 * time.Millisecond)
	}
	d := &webDriver{t: t, base: root, timeout: testenv.WaitTimeout}
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"goog:chromeOptions": map[string]any{"args": []string{"--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"}},
	}}}
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	_ = json.Unmarshal(d.do("POST", "/session", caps), &sess)
	d.base = root + "/session/" + sess.SessionID
	t.Cleanup(func() { d.do("DELETE", "", nil) })

	d.do("POST", "/url", map[string]string{"url": s.base + "/ui"})
	d.do("POST", "/element/"+d.find("#token")+"/value", map[string]string{"text": token})
	d.click("#load")
	d.waitFor("the source", func(s string) bool {
		return strings.Contains(s, "prod\tcluster") || strings.Contains(s, "prod cluster")
	})

	d.do("POST", "/element/"+d.find("#bname")+"/value", map[string]string{"text": "web1"})
	d.click("#create")
	d.waitFor("the new branch", func(s string) bool { return strings.Contains(s, "postgresql://branch_web1:") })
	var url string
	for _, f := range strings.Fields(d.text()) {
		if strings.HasPrefix(f, "postgresql://branch_web1:") {
			url = f
		}
	}
	pgtest.Exec(t, url, "CREATE TABLE made_here (x int)")
	d.click("#branches tbody button") // Reset
	testenv.WaitFor(t, "the page's Reset to reset the branch", func() bool { return tableGone(url, "made_here") })
	d.click("#branches tbody button:nth-of-type(3)") // Stop
	d.waitFor("the branch stopped", func(s string) bool { return strings.Contains(s, "web1 (stopped)") })
	if pingURL(url) == nil {
		t.Error("the branch stopped on the page still answers")
	}
	d.click("#branches tbody button:nth-of-type(3)") // Start
	d.waitFor("the branch started", func(s string) bool { return strings.Contains(s, "web1") && !strings.Contains(s, "(stopped)") })
	if err := pingURL(url); err != nil {
		t.Errorf("the branch started on the page does not answer: %v", err)
	}
	d.click("#branches tbody button:nth-of-type(2)") // Delete
	d.waitFor("no branch", func(s string) bool { return !strings.Contains(s, "branch_web1") })
	if got := branchCLI(t, s.base, token, "ls", "--json"); strings.Contains(got.stdout, "web1") {
		t.Errorf("the branch deleted on the page is still listed:\n%s", got.stdout)
	}
}
