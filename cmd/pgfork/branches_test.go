package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestBranchCLI walks docs/branches.md against a real `pgfork serve` with a
// running source: create a branch with the CLI, connect, break it, reset
// it (same URL, changes gone), snapshot it, branch the snapshot, delete;
// another token sees and deletes nothing of it; protect and the quota
// refuse with their exit codes; the page is served without a token, the
// API not.
func TestBranchCLI(t *testing.T) {
	t.Parallel() // see TestMain
	bin, pgBin, dir, src := branchSource(t, "INSERT INTO seed VALUES (1)")

	s := startServe(t, bin, filepath.Join(dir, "home"), pgBin, []string{"PGFORK_TOKEN=root-secret-0123456789", "PGFORK_BRANCH_TOKENS=alice-0123456789abcdef,bob-0123456789abcdefgh"},
		"--branch-source", "prod=cluster:"+src, "--branch-quota", "2", "--branch-min-free", "1MiB")
	as := func(tok string, args ...string) cliResult {
		t.Helper()
		return branchCLI(t, s.base, tok, args...)
	}
	ok := func(r cliResult) string { t.Helper(); return r.ok(t) }

	url := ok(as("alice-0123456789abcdef", "create", "dev", "--source", "prod"))
	if !strings.Contains(url, "127.0.0.1") || strings.Contains(url, "postgres:") {
		t.Fatalf("connection string %q: want TCP loopback and a role of its own", url)
	}
	pgtest.Exec(t, url, "DROP TABLE seed")
	if got := ok(as("alice-0123456789abcdef", "reset", "dev")); got != url {
		t.Errorf("reset moved the branch to %q from %q", got, url)
	}
	if got := pgtest.Query(t, url, "SELECT count(*) FROM seed"); got != "1" {
		t.Errorf("after reset seed has %s rows", got)
	}
	pgtest.Exec(t, url, "INSERT INTO seed VALUES (2)")
	ok(as("alice-0123456789abcdef", "snapshot", "dev", "before-migration"))
	url2 := ok(as("alice-0123456789abcdef", "create", "dev2", "--snapshot", "before-migration"))
	if got := pgtest.Query(t, url2, "SELECT count(*) FROM seed"); got != "2" {
		t.Errorf("branch of the snapshot has %s rows", got)
	}
	if r := as("alice-0123456789abcdef", "create", "dev3", "--source", "prod"); r.code != 8 {
		t.Errorf("a third branch over a quota of 2: exit %d (%s), want 8", r.code, r.stderr)
	}
	if l := ok(as("bob-0123456789abcdefgh", "ls")); strings.Contains(l, "dev") && strings.Contains(l, "branch ") {
		t.Errorf("bob lists alice's branches:\n%s", l)
	}
	if r := as("bob-0123456789abcdefgh", "rm", "dev"); r.code != 3 {
		t.Errorf("bob removing alice's branch: exit %d, want 3 (not found)", r.code)
	}
	if l := ok(as("root-secret-0123456789", "ls")); !strings.Contains(l, "dev2") || !strings.Contains(l, "2 of 2 branches") {
		t.Errorf("the admin token does not list alice's branches and her use of the quota:\n%s", l)
	}
	ok(as("alice-0123456789abcdef", "protect", "dev"))
	if r := as("alice-0123456789abcdef", "rm", "dev"); r.code != 6 {
		t.Errorf("removing a protected branch: exit %d, want 6", r.code)
	}
	ok(as("alice-0123456789abcdef", "protect", "dev", "--off"))
	if code, _ := s.call(t, "GET", "/ui", ""); code != 200 {
		t.Errorf("GET /ui: %d", code)
	}
	if code, _ := s.call(t, "GET", "/api/v2/branches", ""); code != 401 {
		t.Errorf("GET /api/v2/branches without a token: %d, want 401", code)
	}
	ok(as("alice-0123456789abcdef", "rm", "dev", "dev2"))
	ok(as("alice-0123456789abcdef", "rm", "--snapshot", "before-migration"))
	if l := ok(as("alice-0123456789abcdef", "ls")); strings.Contains(l, "dev") || strings.Contains(l, "before-migration") {
		t.Errorf("left after removing everything:\n%s", l)
	}
}

// TestServeBranchFlagsRefused: bad branch flags stop serve before it
// starts anything (exit 2, naming the flag).
func TestServeBranchFlagsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--branch-source", "prod"},
		{"--branch-source", "prod=ftp:/x"},
		{"--branch-source", "prod=backup:/c,bogus=1"},
		{"--branch-source", "prod=cluster:/d", "--branch-snapshot-every", "prod=10s"},
		{"--branch-source", "prod=cluster:/d", "--branch-snapshot-every", "other=1h"},
		{"--branch-source", "prod=cluster:/d", "--branch-snapshot-every", "prod=1h,keep=x"},
		{"--branch-source", "prod=cluster:/d", "--branch-disk-quota", "lots"},
		{"--branch-source", "prod=cluster:/d", "--branch-restart", "later"},
	} {
		r := runInProcess(t, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "branch") {
			t.Errorf("serve %v: exit %d, stderr %s; want 2 naming the branch flag", args, r.code, r.stderr)
		}
	}
	// Tokens come from the environment (or files): too short, or without a source.
	for _, c := range []struct{ env, args []string }{
		{[]string{"PGFORK_BRANCH_TOKENS=short"}, []string{"--branch-source", "prod=cluster:/d"}},
		{[]string{"PGFORK_BRANCH_TOKENS=alice-0123456789abcdef"}, nil},
	} {
		env, args := c.env, append([]string{"serve", "--listen", "127.0.0.1:0"}, c.args...)
		r := runInProcessEnv(t, append(env, "PGFORK_HOME="+testenv.Dir(t)), args...)
		if r.code != 2 || !strings.Contains(r.stderr, "branch") {
			t.Errorf("serve %v with %v: exit %d, stderr %s; want 2 naming the branch tokens", args, env, r.code, r.stderr)
		}
	}
}

// TestBranchRestartStopped: with --branch-restart stopped, serve stops its
// branches when it exits and a restart leaves them stopped (listed so);
// `pgfork branch start` runs one again on its URL with its data, `stop`
// stops it.
func TestBranchRestartStopped(t *testing.T) {
	t.Parallel() // see TestMain
	bin, pgBin, dir, src := branchSource(t)
	const tok = "alice-0123456789abcdef"
	args := []string{"--branch-source", "prod=cluster:" + src, "--branch-min-free", "1MiB", "--branch-restart", "stopped"}
	env := []string{"PGFORK_BRANCH_TOKENS=" + tok, "PGFORK_TOKEN=admin-0123456789abcdef"}
	s := startServe(t, bin, filepath.Join(dir, "home"), pgBin, env, args...)
	as := func(args ...string) cliResult {
		t.Helper()
		return branchCLI(t, s.base, tok, args...)
	}
	ok := func(r cliResult) string { t.Helper(); return r.ok(t) }
	url := ok(as("create", "kept", "--source", "prod"))
	pgtest.Exec(t, url, "INSERT INTO seed VALUES (7)")

	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
	if err := pingURL(url); err == nil {
		t.Error("the branch still runs after serve exited with --branch-restart stopped")
	}
	s = startServe(t, bin, filepath.Join(dir, "home"), pgBin, env, args...)
	if l := ok(as("ls")); !strings.Contains(l, "kept (stopped)") {
		t.Errorf("after the restart the branch is not listed stopped:\n%s", l)
	}
	if err := pingURL(url); err == nil {
		t.Error("the branch was started by the restart")
	}
	if got := ok(as("start", "kept")); got != url {
		t.Errorf("start moved the branch to %q from %q", got, url)
	}
	if got := pgtest.Query(t, url, "SELECT string_agg(id::text, ',') FROM seed"); got != "7" {
		t.Errorf("the started branch has rows %q, want 7", got)
	}
	ok(as("stop", "kept"))
	if err := pingURL(url); err == nil {
		t.Error("the branch answers after stop")
	}
	ok(as("rm", "kept"))
}

// pingURL connects to url and leaves; a server that runs has a minute to
// answer (a loaded machine's), one that does not refuses at once.
func pingURL(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// branchCLI runs `pgfork branch ARGS` in-process against the serve at base
// with token tok.
func branchCLI(t *testing.T, base, tok string, args ...string) cliResult {
	t.Helper()
	return runInProcessEnv(t, []string{"PGFORK_HOME=" + testenv.Dir(t), "PGFORK_TOKEN=" + tok}, append([]string{"branch"}, append(args, "--server", base)...)...)
}

// ok fails the test unless the command exited 0, and returns its output
// trimmed.
func (r cliResult) ok(t *testing.T) string {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// branchSource makes what the branch tests serve from: a running cluster
// in src (on the XFS test volume, in dir) with a table seed, filled by the
// statements given and owned by an application role (a branch's role, no
// superuser, changes it as its owner); bin runs pgfork and pgBin is the
// cluster's PostgreSQL.
func branchSource(t *testing.T, fill ...string) (bin, pgBin, dir, src string) {
	t.Helper()
	bin, pgBin, dir = pgforkBinary(t), testenv.PGBinDirs(t)[0], testenv.XFSDir(t)
	src = filepath.Join(dir, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: pgBin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: pgBin})
	pgtest.Exec(t, in.ConnString("", ""), append(append([]string{"CREATE TABLE seed (id int)"}, fill...),
		"CREATE ROLE app NOLOGIN", "ALTER TABLE seed OWNER TO app")...)
	return bin, pgBin, dir, src
}

// branchAPI sends method path with body to the serve at base, with the
// bearer tok (none if empty) and extra headers (name, value pairs).
func branchAPI(t *testing.T, base, method, path, tok, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

// TestServeBranchTokensAlone (issue 32): a real serve with branch tokens
// (and the admin token that serving branches needs since issue 57, rule 1).
//   - F5: before, it checked nothing: no header or a made-up bearer was let
//     in, each made-up bearer a new owner with a fresh quota. Now a branch
//     route needs one of the branch tokens, on loopback and with
//     --allow-from alike.
//   - F12: a name taken is 409, the same answer whether the caller or
//     another token holds it (was 423 here, 404 elsewhere: the owner's
//     branch was revealed); ttl_seconds negative or overflowing (was:
//     never expires) and keep negative are 400 naming the field and range.
//   - F13/F14 against the real thing: another site's Origin is refused and
//     the page may not be framed.
//   - issue 57, G1: the pools take the admin token only (no bearer and a
//     branch token get 401).
func TestServeBranchTokensAlone(t *testing.T) {
	t.Parallel() // see TestMain
	bin, pgBin, dir, src := branchSource(t)
	const alice, bob, madeUp = "alice-0123456789abcdef", "bob-0123456789abcdefgh", "made-up-0123456789abcdef"
	const admin = "admin-0123456789abcdefgh"
	env := []string{"PGFORK_BRANCH_TOKENS=" + alice + "," + bob, "PGFORK_TOKEN=" + admin}
	args := []string{"--branch-source", "prod=cluster:" + src,
		"--branch-min-free", "1MiB", "--branch-quota", "1"}
	home := filepath.Join(dir, "home")
	refused := func(s *serveProc, how string) {
		t.Helper()
		for _, tok := range []string{"", madeUp} {
			for _, c := range []struct{ method, path, body string }{
				{"GET", "/api/v2/branches", ""},
				{"GET", "/api/v2/sources", ""},
				{"POST", "/api/v2/branches", `{"name":"sneak","source":"prod"}`},
				{"DELETE", "/api/v2/branches/dev", ""},
			} {
				if code, _, body := branchAPI(t, s.base, c.method, c.path, tok, c.body); code != 401 {
					t.Errorf("%s: %s %s with bearer %q: %d %s, want 401", how, c.method, c.path, tok, code, body)
				}
			}
		}
		if code, _, body := branchAPI(t, s.base, "GET", "/api/v2/branches", bob, ""); code != 200 {
			t.Errorf("%s: bob's token: %d %s, want 200", how, code, body)
		}
	}

	s := startServe(t, bin, home, pgBin, env, args...)
	refused(s, "loopback")
	if code, _, body := branchAPI(t, s.base, "POST", "/api/v2/branches", alice, `{"name":"dev","source":"prod"}`); code != 201 {
		t.Fatalf("alice creates dev: %d %s", code, body)
	}
	_, _, mine := branchAPI(t, s.base, "POST", "/api/v2/branches", alice, `{"name":"dev","source":"prod"}`)
	code, _, theirs := branchAPI(t, s.base, "POST", "/api/v2/branches", bob, `{"name":"dev","source":"prod"}`)
	if code != 409 || mine != theirs || strings.Contains(theirs, "alice") {
		t.Errorf("a taken name: bob gets %d %s, alice %s; want 409, the same answer, no owner", code, theirs, mine)
	}
	if r := branchCLI(t, s.base, bob, "create", "dev", "--source", "prod"); r.code != 4 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("the CLI creating a taken name: exit %d (%s), want 4", r.code, r.stderr)
	}
	for _, c := range []struct{ path, body, field, rng string }{
		{"/api/v2/branches", `{"name":"t1","source":"prod","ttl_seconds":-1}`, "ttl_seconds", "315360000"},
		{"/api/v2/branches", `{"name":"t1","source":"prod","ttl_seconds":9223372036854775807}`, "ttl_seconds", "315360000"},
		{"/api/v2/branches", `{"name":"t1","source":"prod","ttl_seconds":1e30}`, "ttl_seconds", "315360000"},
		{"/api/v2/snapshots", `{"name":"s1","source":"prod","keep":-1}`, "keep", "or more"},
	} {
		if code, _, body := branchAPI(t, s.base, "POST", c.path, bob, c.body); code != 400 || !strings.Contains(body, c.field) || !strings.Contains(body, c.rng) {
			t.Errorf("POST %s %s: %d %s; want 400 naming %s and its range", c.path, c.body, code, body, c.field)
		}
	}
	if code, _, body := branchAPI(t, s.base, "DELETE", "/api/v2/branches/dev", alice, "", "Origin", "http://evil.example"); code != 403 {
		t.Errorf("DELETE from another site's page: %d %s, want 403", code, body)
	}
	for _, tok := range []string{"", bob} {
		if code, _, body := branchAPI(t, s.base, "POST", "/api/v1/templates", tok, `{"hash":"notyours"}`); code != 401 {
			t.Errorf("a pool route with bearer %q: %d %s, want 401 (the admin token only)", tok, code, body)
		}
	}
	code, h, _ := branchAPI(t, s.base, "GET", "/ui", "", "")
	if code != 200 || h.Get("X-Frame-Options") != "DENY" || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Errorf("GET /ui: %d, X-Frame-Options %q, CSP %q: want 200 and no framing", code, h.Get("X-Frame-Options"), h.Get("Content-Security-Policy"))
	}
	if code, _, body := branchAPI(t, s.base, "DELETE", "/api/v2/branches/dev", alice, "", "Origin", s.base); code != 204 {
		t.Errorf("alice deletes dev from the server's own page: %d %s", code, body)
	}

	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
	s = startServe(t, bin, home, pgBin, env, append(args, "--allow-from", "10.0.0.0/8")...)
	refused(s, "--allow-from")
	// The admin token carried in the path (as IntegreSQL clients do) is the
	// admin on the branch routes too: it sees and deletes alice's branch
	// (it used to act as an anonymous owner there, seeing nothing).
	if code, _, body := branchAPI(t, s.base, "POST", "/api/v2/branches", alice, `{"name":"seen","source":"prod"}`); code != 201 {
		t.Fatalf("alice creates seen: %d %s", code, body)
	}
	if code, _, body := branchAPI(t, s.base, "GET", "/"+admin+"/api/v2/branches", "", ""); code != 200 || !strings.Contains(body, `"seen"`) {
		t.Errorf("the admin token in the path lists branches: %d %s, want 200 with alice's branch", code, body)
	}
	// Where the source lives is the admin's to see, not a branch token's.
	if _, _, body := branchAPI(t, s.base, "GET", "/api/v2/sources", alice, ""); strings.Contains(body, src) {
		t.Errorf("a branch token sees the source's data directory: %s", body)
	}
	if _, _, body := branchAPI(t, s.base, "GET", "/api/v2/sources", admin, ""); !strings.Contains(body, src) {
		t.Errorf("the admin does not see the source's data directory: %s", body)
	}
	if code, _, body := branchAPI(t, s.base, "DELETE", "/"+admin+"/api/v2/branches/seen", "", ""); code != 204 {
		t.Errorf("the admin token in the path deletes alice's branch: %d %s, want 204", code, body)
	}
}

// TestBranchCreateStore: a stopped cluster on XFS, the state directory on
// a tmpfs: pgfork branch create --source cluster:SRC without --data-dir
// puts the branch in the branch store beside the source
// (.pgfork-branches/NAME), a clone sharing its blocks with the source
// (FIEMAP), says where, warns of no copy and keeps nothing of it in the
// state directory; branch rm leaves nothing beside the source, not even
// the store. A source whose parent others may write cannot have a store
// there: it is copied into the state directory, and the warning says why
// (issue 60).
func TestBranchCreateStore(t *testing.T) {
	t.Parallel() // see TestMain
	b := pgtest.Builds(t, 0)[0]
	base, src, rel := stoppedSourceOnXFS(t, b)
	state := filepath.Join(testenv.TmpfsDir(t), "state")
	pg := func(args ...string) cliResult {
		return runInProcess(t, append([]string{"--state-dir", state, "--pg-bin", b.Bin}, args...)...)
	}
	t.Cleanup(func() { pg("branch", "rm", "dev"); pg("branch", "rm", "open") })
	r := pg("branch", "create", "dev", "--source", "cluster:"+src)
	url := r.ok(t)
	if strings.Contains(r.stderr, "not cloned") {
		t.Errorf("a branch that could be made beside the source warned of a copy:\n%s", r.stderr)
	}
	data := filepath.Join(base, ".pgfork-branches", "dev")
	if !strings.Contains(r.stderr, data) {
		t.Errorf("the output does not say the branch's data went to %s:\n%s", data, r.stderr)
	}
	if n := pgtest.Query(t, url, "SELECT count(*) FROM t"); n != "50000" {
		t.Errorf("the branch has %s rows, want 50000", n)
	}
	if !sharesExtents(t, filepath.Join(src, rel), filepath.Join(data, rel)) {
		t.Errorf("%s in the branch's data directory shares no extent with the source's: copied, not cloned", rel)
	}
	for _, sub := range []string{"snap", "data"} {
		if ents, _ := os.ReadDir(filepath.Join(state, "branches", sub)); len(ents) != 0 {
			t.Errorf("the state directory's branches/%s holds %v", sub, ents)
		}
	}
	pg("branch", "rm", "dev").ok(t)
	ents, _ := os.ReadDir(base)
	var left []string
	for _, e := range ents {
		if e.Name() != "src" {
			left = append(left, e.Name())
		}
	}
	if len(left) != 0 {
		t.Errorf("after branch rm, beside the source: %v, want nothing", left)
	}

	// A parent others may write: no store there, a copy, and why.
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	src2 := filepath.Join(open, "src")
	if err := os.Rename(src, src2); err != nil {
		t.Fatal(err)
	}
	r = pg("branch", "create", "open", "--source", "cluster:"+src2)
	url = r.ok(t)
	if !strings.Contains(r.stderr, "not cloned") || !strings.Contains(r.stderr, "others may write "+open) {
		t.Errorf("a copy because the store could not be used: want a warning saying why (others may write %s):\n%s", open, r.stderr)
	}
	if n := pgtest.Query(t, url, "SELECT count(*) FROM t"); n != "50000" {
		t.Errorf("the copied branch has %s rows, want 50000", n)
	}
	if _, err := os.Lstat(filepath.Join(open, ".pgfork-branches")); err == nil {
		t.Errorf("a branch store was made in %s, which others may write", open)
	}
	pg("branch", "rm", "open").ok(t)
}

// TestBranchCreateDataDir: a stopped cluster on XFS, the state directory
// on a tmpfs: pgfork branch create --source cluster:SRC --data-dir DIR,
// DIR on the source's XFS, makes DIR the branch's data directory, a clone
// sharing its blocks with the source (FIEMAP), with nothing of it in the
// state directory and no warning of a copy; a snapshot of it and a branch
// of that snapshot live beside it; once all are removed nothing is left
// there. --data-dir with --snapshot, or with --server, exits 2 (issue 60).
func TestBranchCreateDataDir(t *testing.T) {
	t.Parallel() // see TestMain
	b := pgtest.Builds(t, 0)[0]
	base, src, rel := stoppedSourceOnXFS(t, b)
	state := filepath.Join(testenv.TmpfsDir(t), "state")
	pg := func(args ...string) cliResult {
		return runInProcess(t, append([]string{"--state-dir", state, "--pg-bin", b.Bin}, args...)...)
	}
	dst := filepath.Join(base, "dev")
	r := pg("branch", "create", "dev", "--source", "cluster:"+src, "--data-dir", dst)
	t.Cleanup(func() { pg("branch", "rm", "dev2", "dev"); pg("branch", "rm", "--snapshot", "snap") })
	url := r.ok(t)
	if strings.Contains(r.stderr, "not cloned") {
		t.Errorf("a branch made on the source's filesystem warned of a copy:\n%s", r.stderr)
	}
	if n := pgtest.Query(t, url, "SELECT count(*) FROM t"); n != "50000" {
		t.Errorf("the branch has %s rows, want 50000", n)
	}
	if !sharesExtents(t, filepath.Join(src, rel), filepath.Join(dst, rel)) {
		t.Errorf("%s in the branch's data directory shares no extent with the source's: copied, not cloned", rel)
	}
	for _, sub := range []string{"snap", "data"} {
		if ents, _ := os.ReadDir(filepath.Join(state, "branches", sub)); len(ents) != 0 {
			t.Errorf("the state directory's branches/%s holds %v", sub, ents)
		}
	}
	pg("branch", "snapshot", "dev", "snap").ok(t)
	url2 := pg("branch", "create", "dev2", "--snapshot", "snap").ok(t)
	if n := pgtest.Query(t, url2, "SELECT count(*) FROM t"); n != "50000" {
		t.Errorf("the branch of the snapshot has %s rows, want 50000", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "branches", "data")); len(ents) != 0 {
		t.Errorf("a branch of a snapshot beside its data is in the state directory: %v", ents)
	}
	if r := pg("branch", "create", "dev3", "--snapshot", "snap", "--data-dir", filepath.Join(base, "dev3")); r.code != 2 {
		t.Errorf("--data-dir with --snapshot: exit %d, want 2\n%s", r.code, r.stderr)
	}
	if r := pg("branch", "create", "dev3", "--source", "prod", "--data-dir", filepath.Join(base, "dev3"), "--server", "http://127.0.0.1:1"); r.code != 2 {
		t.Errorf("--data-dir with --server: exit %d, want 2\n%s", r.code, r.stderr)
	}
	pg("branch", "rm", "dev2", "dev").ok(t)
	pg("branch", "rm", "--snapshot", "snap").ok(t)
	ents, _ := os.ReadDir(base)
	var left []string
	for _, e := range ents {
		if e.Name() != "src" {
			left = append(left, e.Name())
		}
	}
	if len(left) != 0 {
		t.Errorf("after everything is removed, beside the source: %v, want nothing", left)
	}
}
