package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
)

// TestRestoreCLI runs pgfork restore's options on a backup of the newest
// PostgreSQL build, in-process: --dry-run prints the plan and writes
// nothing, --manifest-checksums picks the algorithm, bad option values
// and combinations exit 2 naming the flag, writing nothing, and --start
// makes a branch that resets and snapshots (issue 35).
func TestRestoreCLI(t *testing.T) {
	t.Parallel() // see TestMain
	builds := pgtest.Builds(t, 17)
	b := builds[len(builds)-1]
	in := pgtest.New(t, b.Server())
	// Owned by an application role, as a branch's role reaches it.
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE t AS SELECT generate_series(1, 1000) x",
		"CREATE ROLE app NOLOGIN", "ALTER TABLE t OWNER TO app")
	base := testenv.Dir(t)
	full := filepath.Join(base, "full")
	b.Tool(t, "pg_basebackup", "-d", in.ConnString("", ""), "-D", full, "-c", "fast", "--no-sync")
	out := filepath.Join(base, "restored")

	r := runInProcess(t, "restore", "--dry-run", full, out)
	if r.code != 0 || !strings.Contains(r.stdout, "would restore 1 backup(s)") || !strings.Contains(r.stdout, "nothing written") {
		t.Fatalf("--dry-run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Lstat(out); !os.IsNotExist(err) {
		t.Fatalf("--dry-run wrote %s", out)
	}
	r = runInProcess(t, "restore", "--dry-run", "--json", full, out)
	var res struct {
		DryRun struct {
			Files []struct {
				Path      string `json:"path"`
				WholeFrom int    `json:"whole_from"`
			} `json:"files"`
			NeedBytes int64 `json:"need_bytes"`
		} `json:"dry_run"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res.DryRun.Files) < 100 || res.DryRun.Files[0].WholeFrom != 1 {
		t.Errorf("--dry-run --json: %v, %d files\n%s", err, len(res.DryRun.Files), r.stdout[:min(len(r.stdout), 500)])
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--manifest-checksums", "MD5"}, `unknown manifest checksum algorithm "MD5"`},
		{[]string{"--no-manifest-checksums", "--manifest-checksums", "SHA256"}, "contradict"},
		{[]string{"--link", "--start"}, "--link is not for --start"},
		{[]string{"--start", "--target-action", "pause"}, "--target-action pause is not for it"},
		{[]string{"--port", "5433"}, "--port is for starting the result"},
		{[]string{"-T", "relative=/x"}, "relative path"},
		{[]string{"-T", "/a=/b", "-T", "/a=/c"}, "names /a twice"},
		{[]string{"-T", "/a=/b"}, "no tablespace of the newest backup is at /a"},
	} {
		r := runInProcess(t, append(append([]string{"restore"}, bad.args...), full, out)...)
		if r.code != 2 || !strings.Contains(r.stderr, bad.want) {
			t.Errorf("restore %v: exit %d, want 2 saying %q\n%s", bad.args, r.code, bad.want, r.stderr)
		}
		if _, err := os.Lstat(out); !os.IsNotExist(err) {
			t.Fatalf("restore %v wrote %s", bad.args, out)
		}
	}

	r = runInProcess(t, "restore", "--manifest-checksums", "sha256", "--sync", "none", full, out)
	if r.code != 0 || !strings.Contains(r.stdout, "backup_manifest with SHA256 checksums") {
		t.Fatalf("--manifest-checksums sha256: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	m, err := pgbackup.ReadManifest(filepath.Join(out, "backup_manifest"))
	if err != nil {
		t.Fatal(err)
	}
	if f := m.Files["PG_VERSION"]; f == nil || f.Algorithm != "SHA256" || len(f.Checksum) != 32 {
		t.Errorf("PG_VERSION's manifest entry: %+v", f)
	}

	// --start is branch creation: DST, which names it, is its data
	// directory (its snapshot beside it), listed with its source, reset to
	// the restored point, snapshotted and removed as any branch; the
	// snapshot of it and the branch of that snapshot live beside it too,
	// and once all are removed nothing is left there.
	state := filepath.Join(base, "state")
	pg := func(args ...string) cliResult {
		return runInProcess(t, append([]string{"--state-dir", state, "--pg-bin", b.Bin}, args...)...)
	}
	t.Cleanup(func() { pg("branch", "rm", "yesterday") })
	yesterday := filepath.Join(base, "yesterday")
	r = pg("restore", full, yesterday, "--start", "--json")
	var br struct{ Name, From, URL string }
	if err := json.Unmarshal([]byte(r.ok(t)), &br); err != nil || br.Name != "yesterday" || br.From != "source:full" || br.URL == "" {
		t.Fatalf("restore --start --json: %v, %+v\n%s", err, br, r.stdout)
	}
	if want := "the same as `pgfork branch create yesterday --source backup:" + full + " --data-dir " + yesterday + "`"; !strings.Contains(r.stderr, want) {
		t.Errorf("restore --start does not say it makes a branch (%q):\n%s", want, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(yesterday, "PG_VERSION")); err != nil {
		t.Errorf("restore --start did not make DST the branch's data directory: %v", err)
	}
	pgtest.Exec(t, br.URL, "DELETE FROM t WHERE x > 10")
	pg("branch", "snapshot", "yesterday", "ten").ok(t)
	pg("branch", "reset", "yesterday").ok(t)
	if n := pgtest.Query(t, br.URL, "SELECT count(*) FROM t"); n != "1000" {
		t.Errorf("after reset the branch has %s rows, want the restored 1000", n)
	}
	ls := pg("branch", "ls").ok(t)
	if !regexp.MustCompile(`(?m)^branch +yesterday +source:full `).MatchString(ls) || !regexp.MustCompile(`(?m)^snapshot +ten +branch:yesterday `).MatchString(ls) {
		t.Errorf("branch ls does not list the branch with its source and its snapshot:\n%s", ls)
	}
	if n := pgtest.Query(t, pg("branch", "create", "tenth", "--snapshot", "ten").ok(t), "SELECT count(*) FROM t"); n != "10" {
		t.Errorf("a branch of the snapshot taken before the reset has %s rows, want 10", n)
	}
	pg("branch", "rm", "tenth").ok(t)
	pg("branch", "rm", "yesterday").ok(t)
	pg("branch", "rm", "--snapshot", "ten").ok(t)
	for _, p := range []string{yesterday, filepath.Join(base, ".yesterday.pgfork")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("after the branches and the snapshot are removed, %s is left (%v)", p, err)
		}
	}
}

// TestRestoreStartCrossingNotice: a backup on XFS. restore --start DST
// with DST on a tmpfs says on stderr, before it copies, that the backup is
// copied into DST and not cloned, how much, and what avoids it; pgfork
// branch create from the backup with the state directory on a tmpfs makes
// no copy (it goes to the branch store beside the backup, and says so;
// TestBranchCreateStore covers the store's fallback to the copy and its
// warning), and says nothing with the state on the backup's own XFS
// (issue 60).
func TestRestoreStartCrossingNotice(t *testing.T) {
	t.Parallel() // see TestMain
	b := pgtest.Builds(t, 17)[0]
	in := pgtest.New(t, b.Server())
	base := testenv.XFSDir(t)
	full := filepath.Join(base, "chain")
	if _, err := pgbackup.Take(context.Background(), pgbackup.TakeOptions{Dir: full, ConnString: in.ConnString("", ""),
		PGBin: pgbin.Options{Explicit: b.Bin, StateDir: t.TempDir()}}); err != nil {
		t.Fatal(err)
	}
	tmpfs := testenv.TmpfsDir(t)
	for _, c := range []struct {
		state string
		args  []string
		warn  string // the middle of the warning; "": none
		store bool   // the branch goes to the branch store beside the backup
	}{
		{filepath.Join(base, "state1"), []string{"restore", full, filepath.Join(tmpfs, "yesterday"), "--start"},
			` into ` + regexp.QuoteMeta(filepath.Join(tmpfs, "yesterday")) + ` \(tmpfs\), another filesystem; to clone it, give a data directory on the filesystem of `, false},
		{filepath.Join(tmpfs, "state"), []string{"branch", "create", "yesterday", "--source", "backup:" + full}, "", true},
		{filepath.Join(base, "state2"), []string{"branch", "create", "yesterday", "--source", "backup:" + full}, "", false},
	} {
		pg := func(args ...string) cliResult {
			return runInProcess(t, append([]string{"--state-dir", c.state, "--pg-bin", b.Bin}, args...)...)
		}
		r := pg(c.args...)
		t.Cleanup(func() { pg("branch", "rm", "yesterday") })
		r.ok(t)
		warn := regexp.MustCompile(`(?m)^warning: source chain is copied, not cloned: about [0-9.]+ MiB from ` + regexp.QuoteMeta(full) +
			` \(xfs\)` + c.warn + regexp.QuoteMeta(full) + `\n`)
		if got := c.warn != "" && warn.MatchString(r.stderr); got != (c.warn != "") || (c.warn != "") != strings.Contains(r.stderr, "not cloned") {
			t.Errorf("pgfork %v with the state in %s: warning given %v, want %v:\n%s", c.args, c.state, got, c.warn != "", r.stderr)
		}
		if got := strings.Contains(r.stderr, filepath.Join(base, ".pgfork-branches", "yesterday")+", in the branch store beside the source"); got != c.store {
			t.Errorf("pgfork %v with the state in %s: in the branch store %v, want %v:\n%s", c.args, c.state, got, c.store, r.stderr)
		}
	}
}

// TestRestoreStartBesideItsData: a backup on XFS, the state directory on
// a tmpfs (another filesystem): restore --start DST, with DST on the
// backup's XFS, makes the branch's data directory DST itself, a clone
// sharing its blocks with the backup (FIEMAP: the same physical
// extents), says nothing of a copy, starts it and answers; nothing of it
// is in the state directory; reset and rm find it where it is, and rm
// removes DST and the home pgfork made beside it (issue 60).
func TestRestoreStartBesideItsData(t *testing.T) {
	t.Parallel() // see TestMain
	b := pgtest.Builds(t, 17)[0]
	in := pgtest.New(t, b.Server())
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE t AS SELECT g AS id, repeat('x', 100) AS pad FROM generate_series(1, 50000) g")
	rel := pgtest.Query(t, in.ConnString("", ""), "SELECT pg_relation_filepath('t')")
	base := testenv.XFSDir(t)
	chain := filepath.Join(base, "chain")
	if _, err := pgbackup.Take(context.Background(), pgbackup.TakeOptions{Dir: chain, ConnString: in.ConnString("", ""),
		PGBin: pgbin.Options{Explicit: b.Bin, StateDir: t.TempDir()}}); err != nil {
		t.Fatal(err)
	}
	backups, err := pgbackup.Discover(chain, "")
	if err != nil || len(backups) != 1 {
		t.Fatalf("chain %s: %v %v", chain, backups, err)
	}
	state := filepath.Join(testenv.TmpfsDir(t), "state")
	pg := func(args ...string) cliResult {
		return runInProcess(t, append([]string{"--state-dir", state, "--pg-bin", b.Bin}, args...)...)
	}
	dst := filepath.Join(base, "yesterday")
	r := pg("restore", chain, dst, "--start")
	t.Cleanup(func() { pg("branch", "rm", "yesterday") })
	r.ok(t)
	if strings.Contains(r.stderr, "not cloned") {
		t.Errorf("restore --start into the backup's filesystem warned of a copy:\n%s", r.stderr)
	}
	url := regexp.MustCompile(`postgresql://\S+`).FindString(r.stdout)
	if n := pgtest.Query(t, url, "SELECT count(*) FROM t"); n != "50000" {
		t.Errorf("the branch has %s rows, want 50000", n)
	}
	if _, err := os.Stat(filepath.Join(dst, "PG_VERSION")); err != nil {
		t.Fatalf("DST is not the branch's data directory: %v", err)
	}
	if !sharesExtents(t, filepath.Join(backups[0], rel), filepath.Join(dst, rel)) {
		t.Errorf("%s in DST shares no extent with the backup's: copied, not cloned", rel)
	}
	for _, sub := range []string{"snap", "data"} {
		if ents, _ := os.ReadDir(filepath.Join(state, "branches", sub)); len(ents) != 0 {
			t.Errorf("the state directory's branches/%s holds %v", sub, ents)
		}
	}
	pgtest.Exec(t, url, "DELETE FROM t")
	pg("branch", "reset", "yesterday").ok(t)
	if n := pgtest.Query(t, url, "SELECT count(*) FROM t"); n != "50000" {
		t.Errorf("after reset the branch has %s rows, want 50000", n)
	}
	if !sharesExtents(t, filepath.Join(backups[0], rel), filepath.Join(dst, rel)) {
		t.Errorf("after reset %s in DST shares no extent with the backup's", rel)
	}
	r = pg("restore", chain, dst, "--start", "--name", "again")
	if r.code != 4 || !strings.Contains(r.stderr, dst) {
		t.Errorf("restore --start into the existing DST: exit %d, want 4 (exists)\n%s", r.code, r.stderr)
	}
	pg("branch", "rm", "yesterday").ok(t)
	ents, _ := os.ReadDir(base)
	var left []string
	for _, e := range ents {
		if e.Name() != "chain" {
			left = append(left, e.Name())
		}
	}
	if len(left) != 0 {
		t.Errorf("after branch rm, beside the chain: %v, want nothing", left)
	}
}

// sharesExtents says whether files a and b have a physical extent in
// common (FIEMAP): b is, at least in part, a clone of a.
// stoppedSourceOnXFS makes a stopped cluster of build b in a directory
// "src" of a fresh XFS directory base, with a table t of 50,000 rows, and
// returns base, src and t's relation file path relative to src.
func stoppedSourceOnXFS(t *testing.T, b pgtest.Build) (base, src, rel string) {
	t.Helper()
	base = testenv.XFSDir(t)
	src = filepath.Join(base, "src")
	pgtest.InitDB(t, src, pgtest.Server{BinDir: b.Bin})
	in := pgtest.Start(t, src, pgtest.Server{BinDir: b.Bin})
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE t AS SELECT g AS id, repeat('x', 100) AS pad FROM generate_series(1, 50000) g",
		"CHECKPOINT")
	rel = pgtest.Query(t, in.ConnString("", ""), "SELECT pg_relation_filepath('t')")
	pgtest.Stop(t, in)
	return base, src, rel
}

func sharesExtents(t *testing.T, a, b string) bool {
	t.Helper()
	starts := map[uint64]bool{}
	for i, p := range []string{a, b} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		shared := false
		ok, err := clone.Extents(f, func(x clone.Extent) {
			if x.Placed && i == 0 {
				starts[x.Physical] = true
			} else if x.Placed && starts[x.Physical] {
				shared = true
			}
		})
		f.Close()
		if !ok || err != nil {
			t.Fatalf("FIEMAP of %s: %v %v", p, ok, err)
		}
		if i == 1 {
			return shared
		}
	}
	return false
}
