package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/template"
	"github.com/pgfork/pgfork/up"
)

// pgfk runs pgfork in-process with --state-dir home (bin, the pgfork
// binary, for what needs a process of its own).
type pgfk struct {
	t         *testing.T
	bin, home string
	pgBin     string
	extraEnv  []string
}

func newPgfk(t *testing.T, bin, home, pgBin string) *pgfk {
	p := &pgfk{t: t, bin: bin, home: home, pgBin: pgBin}
	// Whatever a test leaves running is stopped and removed at the end,
	// once the background spare refills are done (they write in home).
	t.Cleanup(func() { runInProcessEnv(t, nil, "--state-dir", home, "down", "--all", "--timeout", "1s") })
	t.Cleanup(func() { waitRefills(t, home) })
	return p
}

// newTestPgfk is newPgfk with what most tests want: a freshly built
// binary, the first PostgreSQL build under test and a fresh home.
func newTestPgfk(t *testing.T) *pgfk {
	t.Helper()
	bin := pgforkBinary(t)
	pgBin := testenv.PGBinDirs(t)[0]
	return newPgfk(t, bin, testenv.Dir(t), pgBin)
}

// waitRefills waits until no spare refiller runs in home (it holds its
// key's refill lock, or waits for it holding the .wait lock).
func waitRefills(t *testing.T, home string) {
	t.Helper()
	locks, _ := filepath.Glob(filepath.Join(home, "locks", "spare-*"))
	for _, lp := range locks {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		l, err := flock.Exclusive(ctx, lp)
		cancel()
		if err != nil {
			t.Errorf("a spare refiller still holds %s: %v", lp, err)
			continue
		}
		l.Unlock()
	}
}

// spareDirs lists the claimable spares of template key in home.
func spareDirs(t *testing.T, home, key string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(home, "clusters", ".spare-"+key+"-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitSpare waits until template key has n claimable spares (a
// background refill copies a data directory: the load decides how long).
func waitSpare(t *testing.T, home, key string, n int) []string {
	t.Helper()
	var s []string
	testenv.WaitFor(t, fmt.Sprintf("template %s to have %d spares (a background refill)", key, n), func() bool {
		s = spareDirs(t, home, key)
		return len(s) == n
	})
	return s
}

func (p *pgfk) run(args ...string) cliResult {
	p.t.Helper()
	return runInProcessEnv(p.t, p.extraEnv, append([]string{"--state-dir", p.home, "--pg-bin", p.pgBin}, args...)...)
}

func (p *pgfk) up(args ...string) up.Result {
	p.t.Helper()
	r := p.run(append([]string{"up", "--json"}, args...)...)
	if r.code != 0 {
		p.t.Fatalf("pgfork up %v: exit %d\n%s", args, r.code, r.stderr)
	}
	var res up.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		p.t.Fatalf("pgfork up --json: %v\n%s", err, r.stdout)
	}
	return res
}

// upsAtOnce runs n `pgfork up --json` at the same time, the i-th with
// upArgs(i), and returns their results, or the first failure (a non-zero
// exit with its stderr, or unreadable JSON).
func (p *pgfk) upsAtOnce(n int, upArgs func(i int) []string) ([]up.Result, error) {
	var wg sync.WaitGroup
	res := make([]up.Result, n)
	fails := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := p.run(append([]string{"up", "--json"}, upArgs(i)...)...)
			if r.code != 0 {
				fails[i] = fmt.Sprintf("up %d: exit %d: %s", i, r.code, r.stderr)
				return
			}
			if err := json.Unmarshal([]byte(r.stdout), &res[i]); err != nil {
				fails[i] = err.Error()
			}
		}()
	}
	wg.Wait()
	for _, f := range fails {
		if f != "" {
			return nil, errors.New(f)
		}
	}
	return res, nil
}

func (p *pgfk) ls() []cluster.Entry {
	p.t.Helper()
	r := p.run("ls", "--json")
	if r.code != 0 {
		p.t.Fatalf("pgfork ls: exit %d\n%s", r.code, r.stderr)
	}
	var es []cluster.Entry
	if err := json.Unmarshal([]byte(r.stdout), &es); err != nil {
		p.t.Fatalf("pgfork ls --json: %v\n%s", err, r.stdout)
	}
	return es
}

func pidAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	testenv.WaitFor(t, fmt.Sprintf("server pid %d to exit", pid), func() bool { return !pidAlive(pid) })
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func dirNames(t *testing.T, d string) []string {
	t.Helper()
	ents, err := os.ReadDir(d)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	return n
}

// TestUpConcurrentBuildsTemplateOnce: 8 `pgfork up` at once (half with
// --tcp) build the template once, and all 8 clusters run, each on its own
// socket directory or port, with the setup (SQL files and command) applied.
func TestUpConcurrentBuildsTemplateOnce(t *testing.T) {
	t.Parallel() // see TestMain
	bin := pgforkBinary(t)
	for _, pgBin := range testenv.PGBinDirs(t) {
		t.Run(filepath.Base(filepath.Dir(pgBin)), func(t *testing.T) {
			home := testenv.Dir(t)
			p := newPgfk(t, bin, home, pgBin)
			work := testenv.Dir(t)
			mig := filepath.Join(work, "migrations")
			if err := os.Mkdir(mig, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(mig, "001_t.up.sql"), "create table t (id int primary key, who text);\n")
			writeFile(t, filepath.Join(mig, "001_t.down.sql"), "drop table t;\n")
			writeFile(t, filepath.Join(mig, "002_rows.up.sql"), "insert into t values (1, 'sql');\n")
			count := filepath.Join(work, "builds")
			// The command proves it got DATABASE_URL by writing through it.
			setupCmd := fmt.Sprintf(`echo built >> %s && %s/psql "$DATABASE_URL" -X -q -c "insert into t values (2, 'cmd')"`, count, pgBin)

			const n = 8
			results, err := p.upsAtOnce(n, func(i int) []string {
				args := []string{"--setup", mig, "--setup-cmd", setupCmd}
				if i%2 == 1 {
					args = append(args, "--tcp")
				}
				return args
			})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(count)
			if got := strings.Count(string(b), "built"); got != 1 {
				t.Errorf("template built %d times by 8 concurrent ups, want 1", got)
			}
			names, sockets, ports := map[string]bool{}, map[string]bool{}, map[int]bool{}
			built := 0
			for i, r := range results {
				if names[r.Name] || sockets[r.SocketDir] {
					t.Errorf("name %s or socket dir %s used twice", r.Name, r.SocketDir)
				}
				names[r.Name], sockets[r.SocketDir] = true, true
				if i%2 == 1 {
					if r.Host == "" || ports[r.Port] {
						t.Errorf("--tcp cluster %s: host %q port %d (clash?)", r.Name, r.Host, r.Port)
					}
					ports[r.Port] = true
				}
				if r.Built {
					built++
				}
				if r.TemplateKey != results[0].TemplateKey {
					t.Errorf("template keys differ: %s %s", r.TemplateKey, results[0].TemplateKey)
				}
				if got := pgtest.Query(t, r.URL, "select string_agg(who, ',' order by id) from t"); got != "sql,cmd" {
					t.Errorf("cluster %s: rows %q, want sql,cmd", r.Name, got)
				}
				// Independent clusters: a write to one is not seen by another.
				pgtest.Query(t, r.URL, fmt.Sprintf("insert into t values (%d, 'own') returning 'x'", 10+i))
			}
			if built != 1 {
				t.Errorf("%d ups report building the template, want 1", built)
			}
			if got := pgtest.Query(t, results[0].URL, "select count(*)::text from t"); got != "3" {
				t.Errorf("cluster 0 sees %s rows, want 3 (its own write only)", got)
			}
			if got := pgtest.Query(t, results[0].URL, "select current_setting('fsync')"); got != "off" {
				t.Errorf("cluster runs without the test profile: fsync=%s", got)
			}
			if os.Geteuid() == 0 {
				if got := pgtest.Query(t, results[0].URL, "select current_setting('data_directory')"); got != results[0].DataDir {
					t.Errorf("data_directory %s, want %s", got, results[0].DataDir)
				}
				fi, err := os.Stat(results[0].DataDir)
				if err != nil {
					t.Fatal(err)
				}
				if uid := fi.Sys().(*syscall.Stat_t).Uid; uid == 0 {
					t.Error("as root, the cluster's data directory belongs to root, not the PostgreSQL user")
				}
			}

			es := p.ls()
			if len(es) != n {
				t.Fatalf("ls lists %d clusters, want %d", len(es), n)
			}
			for _, e := range es {
				if e.State != cluster.Running || e.URL == "" || e.Size <= 0 {
					t.Errorf("ls: %+v", e)
				}
			}
			tl := p.run("template", "ls", "--json")
			var metas []template.Meta
			if err := json.Unmarshal([]byte(tl.stdout), &metas); err != nil || len(metas) != 1 {
				t.Fatalf("template ls: %v %s", err, tl.stdout)
			}
			if m := metas[0]; m.Key != results[0].TemplateKey || len(m.Setup) != 2 || m.SetupCmd == "" || m.Size <= 0 {
				t.Errorf("template ls: %+v", m)
			}

			// A taken name is refused without touching the cluster.
			if r := p.run("up", "--name", results[0].Name); r.code != exitExists {
				t.Errorf("up with a taken name: exit %d, want %d: %s", r.code, exitExists, r.stderr)
			}
			if r := p.run("down", "--all"); r.code != 0 {
				t.Fatalf("down --all: %d %s", r.code, r.stderr)
			}
			for _, r := range results {
				waitGone(t, r.Pid)
				if _, err := os.Stat(r.SocketDir); !os.IsNotExist(err) {
					t.Errorf("socket dir %s left after down", r.SocketDir)
				}
			}
			// Spare copies of the template stay (they belong to it).
			for _, n := range dirNames(t, filepath.Join(home, "clusters")) {
				if !strings.HasPrefix(n, ".spare-"+results[0].TemplateKey+"-") && !strings.HasPrefix(n, ".sparebuild-") {
					t.Errorf("left in clusters/ after down --all: %s", n)
				}
			}
		})
	}
}

// TestUpWhileTemplateRemoved: `pgfork up` keeps working while the template
// is removed (and so rebuilt) under it, and rm refuses while it is in use.
func TestUpWhileTemplateRemoved(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	home := p.home
	work := testenv.Dir(t)
	schema := filepath.Join(work, "schema.sql")
	writeFile(t, schema, "create table kv (k text primary key, v text); insert into kv values ('a', 'b');\n")
	first := p.up("--setup", schema)
	key := first.TemplateKey

	var wg sync.WaitGroup
	errc := make(chan string, 20)
	for round := 0; round < 3; round++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := p.run("template", "rm", key)
			if r.code != 0 && r.code != exitBusy && r.code != exitNotFound {
				errc <- fmt.Sprintf("template rm: exit %d: %s", r.code, r.stderr)
			}
		}()
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := p.run("up", "--json", "--setup", schema)
				if r.code != 0 {
					errc <- fmt.Sprintf("up during template rm: exit %d: %s", r.code, r.stderr)
					return
				}
				var res up.Result
				if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
					errc <- err.Error()
					return
				}
				if got := pgtest.Query(t, res.URL, "select v from kv where k = 'a'"); got != "b" {
					errc <- "setup missing in " + res.Name
				}
			}()
		}
		wg.Wait()
	}
	close(errc)
	for e := range errc {
		t.Error(e)
	}
	if n := len(p.ls()); n != 10 {
		t.Errorf("%d clusters, want 10", n)
	}
	// Removing a template leaves its clusters running.
	if r := p.run("template", "rm", "--all"); r.code != 0 {
		t.Errorf("template rm --all: %d %s", r.code, r.stderr)
	}
	if got := pgtest.Query(t, first.URL, "select v from kv"); got != "b" {
		t.Errorf("first cluster after template rm: %q", got)
	}
	for _, n := range dirNames(t, filepath.Join(home, "templates")) {
		t.Errorf("left in templates/: %s", n)
	}
	if r := p.run("template", "rm", key); r.code != exitNotFound {
		t.Errorf("rm of a removed template: exit %d, want %d", r.code, exitNotFound)
	}
}

// TestUpSetupFailure: a failing setup leaves no template, no cluster and no
// server, and the error shows the setup's own output.
func TestUpSetupFailure(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	home := p.home
	work := testenv.Dir(t)
	bad := filepath.Join(work, "bad.sql")
	writeFile(t, bad, "create table ok (id int);\nselec 1;\n")

	check := func(what string, r cliResult, code int, wants ...string) {
		t.Helper()
		if r.code != code {
			t.Errorf("%s: exit %d, want %d\n%s", what, r.code, code, r.stderr)
		}
		for _, w := range wants {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: stderr lacks %q:\n%s", what, w, r.stderr)
			}
		}
		if got := dirNames(t, filepath.Join(home, "templates")); len(got) != 0 {
			t.Errorf("%s: templates/ holds %v", what, got)
		}
		if got := dirNames(t, filepath.Join(home, "clusters")); len(got) != 0 {
			t.Errorf("%s: clusters/ holds %v", what, got)
		}
		if got := dirNames(t, filepath.Join(home, "run")); len(got) != 0 && (len(got) != 1 || got[0] != "up-pg.json") {
			t.Errorf("%s: run/ holds %v", what, got)
		}
	}
	check("bad SQL", p.run("up", "--name", "x1", "--setup", bad), exitUsage, "bad.sql", `syntax error at or near "selec"`)
	check("failing command", p.run("up", "--setup-cmd", "echo boom-from-setup >&2; exit 3"), exitUsage, "boom-from-setup", "exit status 3")
	check("missing file", p.run("up", "--setup", filepath.Join(work, "nope.sql")), exitNotFound, "nope.sql")
	empty := filepath.Join(work, "empty")
	_ = os.Mkdir(empty, 0o755)
	check("empty dir", p.run("up", "--setup", empty), exitUsage, "no *.sql files")
	check("bad name", p.run("up", "--name", "../evil"), exitUsage, "bad cluster name")
	check("bad ttl", p.run("up", "--ttl", "soon"), exitUsage)
	// No server of the failed build is left: the name is free again and
	// nothing listens under the state directory.
	if out, _ := exec.Command("pgrep", "-f", "-a", home).Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("processes left running: %s", out)
	}
	// And after fixing the SQL, the same name works.
	writeFile(t, bad, "create table ok (id int);\nselect 1;\n")
	res := p.up("--name", "x1", "--setup", bad)
	if got := pgtest.Query(t, res.URL, "select count(*)::text from ok"); got != "0" {
		t.Errorf("fixed setup: %q", got)
	}
}

// TestReaper: clusters past their TTL, whose parent process exited, or
// whose server died are removed by the next pgfork call.
func TestReaper(t *testing.T) {
	t.Parallel() // see TestMain
	p := newTestPgfk(t)
	home := p.home

	parent := exec.Command("sleep", "300")
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = parent.Process.Kill() }()
	keep := p.up("--name", "keep", "--ttl", "1h")
	crash := p.up("--name", "crash")
	orphan := p.up("--name", "child", "--parent-pid", fmt.Sprint(parent.Process.Pid), "--tcp")
	// Long enough for the two ls below to see it under any load (a reaping
	// before them reports to a stderr the test does not read): 15 s was
	// not, on a machine where this test took a minute. The test is
	// parallel: the wait for it to pass overlaps with others.
	ttl := p.up("--name", "short", "--ttl", "60s")
	if ttl.Expires == nil {
		t.Fatal("up --ttl --json gives no expiry")
	}
	if r := p.run("up", "--parent-pid", "999999999"); r.code != exitUsage && r.code != exitNotFound {
		t.Errorf("--parent-pid of no process: exit %d", r.code)
	}

	if es := p.ls(); len(es) != 4 {
		t.Fatalf("ls: %d clusters, want 4", len(es))
	}
	lsText := p.run("ls")
	if !strings.Contains(lsText.stdout, "parent ") || !strings.Contains(lsText.stdout, "keep") {
		t.Errorf("ls output lacks TTL/parent:\n%s", lsText.stdout)
	}
	_ = parent.Process.Kill()
	_ = parent.Wait()
	if err := syscall.Kill(crash.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, crash.Pid)
	time.Sleep(time.Until(*ttl.Expires) + 50*time.Millisecond)

	r := p.run("ls", "--json")
	var es []cluster.Entry
	if err := json.Unmarshal([]byte(r.stdout), &es); err != nil {
		t.Fatal(err, r.stdout)
	}
	if len(es) != 1 || es[0].Name != "keep" || es[0].State != cluster.Running {
		t.Errorf("after reaping: %+v, want only keep", es)
	}
	for _, w := range []string{"short: TTL", "child: parent process", "crash: server is no longer running"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("reaper did not report %q:\n%s", w, r.stderr)
		}
	}
	for _, c := range []up.Result{ttl, orphan} {
		waitGone(t, c.Pid)
	}
	if _, err := os.Stat(crash.DataDir); !os.IsNotExist(err) {
		t.Errorf("dead cluster's data left: %v", err)
	}
	if got := pgtest.Query(t, keep.URL, "select 'ok'"); got != "ok" {
		t.Error(got)
	}
	// A leftover of an up killed mid-way (no cluster.json, lock free) is cleaned.
	left := filepath.Join(home, "clusters", "halfmade")
	if err := os.MkdirAll(filepath.Join(left, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := p.run("down", "keep"); r.code != 0 || strings.TrimSpace(r.stdout) != "keep" {
		t.Errorf("down keep: %d %q %s", r.code, r.stdout, r.stderr)
	}
	waitGone(t, keep.Pid)
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("leftover not reaped: %v", err)
	}
	if r := p.run("down", "keep"); r.code != exitNotFound {
		t.Errorf("down of a removed cluster: exit %d", r.code)
	}
	if r := p.run("down"); r.code != exitUsage {
		t.Errorf("down without names: exit %d", r.code)
	}
}

// TestUpXFS: with the state directory on XFS, clusters are reflink clones of
// the template. One PostgreSQL major (the first under test): the copy method
// is the filesystem's, not the major's, and TestUpConcurrentBuildsTemplateOnce
// runs up on every major.
func TestUpXFS(t *testing.T) {
	home := testenv.XFSDir(t)
	bin := pgforkBinary(t)
	for _, pgBin := range testenv.PGBinDirs(t)[:1] {
		t.Run(filepath.Base(filepath.Dir(pgBin)), func(t *testing.T) {
			p := newPgfk(t, bin, home, pgBin)
			a := p.up()
			b := p.up("--tcp", "--spares", "0") // copies, not a spare
			if b.FromSpare {
				t.Error("up --spares 0 used a spare")
			}
			if a.Method["clone"] == 0 || b.Method["copy"]+b.Method["copy-file-range"] != 0 {
				t.Errorf("on XFS the copy should be reflinks: %v", b.Method)
			}
			for _, c := range []up.Result{a, b} {
				if got := pgtest.Query(t, c.URL, "select current_setting('server_version_num')"); got == "" {
					t.Error("no version")
				}
			}
			if r := p.run("down", a.Name, b.Name); r.code != 0 {
				t.Errorf("down: %d %s", r.code, r.stderr)
			}
		})
	}
}

// TestTemplatePrune: prune keeps recently used templates and removes the rest.
func TestTemplatePrune(t *testing.T) {
	p := newTestPgfk(t)
	home := p.home
	c := p.up()
	// The template's WAL is sparse: clones do not copy its zeroed tail.
	segs, _ := filepath.Glob(filepath.Join(home, "templates", c.TemplateKey, "data", "pg_wal", "0*"))
	if len(segs) == 0 {
		t.Fatal("template has no WAL segment")
	}
	for _, s := range segs {
		fi, err := os.Stat(s)
		if err != nil {
			t.Fatal(err)
		}
		if alloc := fi.Sys().(*syscall.Stat_t).Blocks * 512; alloc > fi.Size()/2 {
			t.Errorf("WAL segment %s: %d of %d bytes allocated, want it sparse", s, alloc, fi.Size())
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "create table w as select g from generate_series(1, 100000) g; checkpoint"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if got := pgtest.Query(t, c.URL, "select count(*)::text from w"); got != "100000" {
		t.Errorf("writes on a clone of a sparse template: %q", got)
	}
	if r := p.run("template", "prune", "--older-than", "1h"); r.code != 0 || strings.TrimSpace(r.stdout) != "" {
		t.Errorf("prune of a fresh template: %d %q", r.code, r.stdout)
	}
	if r := p.run("template", "prune", "--older-than", "0"); r.code != 0 || strings.TrimSpace(r.stdout) != c.TemplateKey {
		t.Errorf("prune --older-than 0: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r := p.run("template", "rm", "zz"); r.code != exitUsage {
		t.Errorf("rm of a non-key: exit %d", r.code)
	}
}

// TestUpKilledMidBuild: a pgfork up killed (-9) while its template's setup
// runs leaves no template and no cluster under a final name; the next up
// cleans the leftovers (including the orphaned build server) and succeeds.
func TestUpKilledMidBuild(t *testing.T) {
	p := newTestPgfk(t)
	bin, pgBin, home := p.bin, p.pgBin, p.home
	work := testenv.Dir(t)
	marker := filepath.Join(work, "hang")
	writeFile(t, marker, "")
	setupCmd := fmt.Sprintf("if [ -e %s ]; then exec sleep 60; fi", marker)

	cmd := exec.Command(bin, "--state-dir", home, "--pg-bin", pgBin, "up", "--name", "victim", "--setup-cmd", setupCmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait for the build server (initdb's single-user runs write a negative pid).
	buildPid := 0
	for i := 0; i < 3000 && buildPid <= 0; i++ {
		m, _ := filepath.Glob(filepath.Join(home, "templates", ".staging-*", "data", "postmaster.pid"))
		if len(m) > 0 {
			b, _ := os.ReadFile(m[0])
			fmt.Sscanf(string(b), "%d", &buildPid)
		}
		if buildPid <= 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if buildPid <= 0 {
		_ = cmd.Process.Kill()
		t.Fatal("the template build server never started")
	}
	time.Sleep(300 * time.Millisecond) // let the setup command start
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !pidAlive(buildPid) {
		t.Fatalf("expected the build server to outlive the killed pgfork (pid %d)", buildPid)
	}
	for _, n := range dirNames(t, filepath.Join(home, "templates")) {
		if !strings.HasPrefix(n, ".staging-") {
			t.Errorf("killed build left %s under templates/", n)
		}
	}
	if es := p.ls(); len(es) != 0 {
		t.Errorf("killed up left clusters: %+v", es)
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	res := p.up("--name", "victim", "--setup-cmd", setupCmd)
	if !res.Built {
		t.Error("the next up did not build the template")
	}
	waitGone(t, buildPid)
	for _, n := range dirNames(t, filepath.Join(home, "templates")) {
		if n != res.TemplateKey {
			t.Errorf("leftover in templates/: %s", n)
		}
	}
	if got := pgtest.Query(t, res.URL, "select 'ok'"); got != "ok" {
		t.Error(got)
	}
}

// TestRelativeStateDir: a relative --state-dir names a directory below
// the working directory, for every path pgfork derives from it: a server
// started there (its socket directory in the state directory, its own
// working directory its data directory) starts and answers, and down
// finds it again. A relative state directory once reached postgres as it
// was written ("could not create lock file").
func TestRelativeStateDir(t *testing.T) {
	t.Parallel()
	bin := pgforkBinary(t)
	pgBin := testenv.PGBinDirs(t)[0]
	work := testenv.Dir(t)
	pgfork := func(args ...string) cliResult {
		cmd := exec.Command(bin, append([]string{"--state-dir", "state", "--pg-bin", pgBin}, args...)...)
		cmd.Dir = work
		return runCLI(t, cmd)
	}
	r := pgfork("up", "--json", "--name", "rel")
	if r.code != 0 {
		t.Fatalf("up with --state-dir state: exit %d\n%s", r.code, r.stderr)
	}
	var res up.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("up --json: %v\n%s", err, r.stdout)
	}
	if got := pgtest.Query(t, res.URL, "SELECT 1"); got != "1" {
		t.Errorf("the cluster answers %q", got)
	}
	if r := pgfork("down", "rel"); r.code != 0 {
		t.Errorf("down: exit %d\n%s", r.code, r.stderr)
	}
}
