package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/testenv"
)

type dbCLI struct {
	t                *testing.T
	bin, home, pgBin string
	env              []string
}

func (p *dbCLI) run(args ...string) (code int, stdout, stderr string) {
	p.t.Helper()
	// pgx reads the libpq variables (PGHOST, …) from the process's
	// environment: set them there for the command's time.
	defer setProcessEnv(p.t, p.env)()
	r := runInProcessEnv(p.t, p.env, append([]string{"--state-dir", p.home, "--pg-bin", p.pgBin}, args...)...)
	return r.code, r.stdout, r.stderr
}

func (p *dbCLI) ok(args ...string) string {
	p.t.Helper()
	code, out, errOut := p.run(args...)
	if code != 0 {
		p.t.Fatalf("pgfork %s: exit %d\n%s", strings.Join(args, " "), code, errOut)
	}
	return out
}

func (p *dbCLI) fails(want int, mention string, args ...string) {
	p.t.Helper()
	code, _, errOut := p.run(args...)
	if code != want || !strings.Contains(errOut, mention) || !strings.Contains(errOut, "hint:") {
		p.t.Errorf("pgfork %s: exit %d, stderr %q; want exit %d mentioning %q with a hint", strings.Join(args, " "), code, errOut, want, mention)
	}
}

// dbCluster builds pgfork, starts a cluster called name with pgfork up
// (stopped when the test ends) and connects to it.
func dbCluster(t *testing.T, name string) (p *dbCLI, url string, conn *pgx.Conn) {
	t.Helper()
	pgBin := testenv.PGBinDirs(t)[0]
	bin := pgforkBinary(t) // stops what the test left running, and TestDBInterrupted signals it
	home := testenv.Dir(t)
	p = &dbCLI{t: t, bin: bin, home: home, pgBin: pgBin}
	t.Cleanup(func() { runInProcessEnv(t, nil, "--state-dir", home, "down", "--all", "--timeout", "1s") })
	var up struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal([]byte(p.ok("up", "--json", "--name", name)), &up); err != nil || up.URL == "" {
		t.Fatalf("pgfork up --json: %v %+v", err, up)
	}
	conn, err := pgx.Connect(context.Background(), up.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return p, up.URL, conn
}

// TestDBCommands drives the db commands against a cluster started with
// pgfork up, by --cluster, --url and the PG* variables.
func TestDBCommands(t *testing.T) {
	p, url, conn := dbCluster(t, "dbcli")
	home := p.home
	up := struct{ URL string }{url}
	ctx := context.Background()
	exists := func(name string) bool {
		var ok bool
		_ = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&ok)
		return ok
	}

	// --cluster, flags after the name; --url, flags before it; PG* env.
	out := p.ok("db", "create", "My DB ü", "--from", "template1", "--cluster", "dbcli")
	if !strings.Contains(out, `created database "My DB ü"`) || !exists("My DB ü") {
		t.Errorf("create by --cluster: %q", out)
	}
	p.ok("db", "create", "--url", up.URL, "--from", "My DB ü", "--strategy", "wal_log", "second")
	u, _ := pgx.ParseConfig(up.URL)
	p.env = []string{"PGHOST=" + u.Host, "PGPORT=" + strconv.Itoa(int(u.Port)), "PGUSER=" + u.User, "PGDATABASE=postgres"}
	var res struct {
		Name     string `json:"name"`
		Strategy string `json:"strategy"`
	}
	if err := json.Unmarshal([]byte(p.ok("db", "create", "third", "--from", "second", "--strategy", "file_copy", "--json")), &res); err != nil ||
		res.Name != "third" || res.Strategy != "file_copy" {
		t.Errorf("create by PG* env --json: %+v %v", res, err)
	}
	// DATABASE_URL, as `export DATABASE_URL=$(pgfork up)` leaves it (PG* pointing elsewhere).
	p.env = []string{"DATABASE_URL=" + up.URL, "PGHOST=/nonexistent"}
	if out := p.ok("db", "create", "from_env", "--from", "template1"); !exists("from_env") {
		t.Errorf("create by DATABASE_URL: %q", out)
	}
	// Completion of snapshot names comes from the same server.
	p.ok("db", "snapshot", "from_env", "snap-one")
	if out := p.ok("__complete", "db", "rm-snapshot", "snap-"); !strings.Contains(out, "snap-one") {
		t.Errorf("completion of snapshot names: %q", out)
	}
	p.ok("db", "rm-snapshot", "snap-one")
	p.env = nil

	// Errors: exit codes and hints, nothing created.
	p.fails(exitExists, `"second" already exists`, "db", "create", "second", "--from", "template1", "--cluster", "dbcli")
	p.fails(exitNotFound, `"nope" does not exist`, "db", "create", "x", "--from", "nope", "--cluster", "dbcli")
	p.fails(exitUsage, "64 bytes", "db", "create", strings.Repeat("é", 32), "--from", "template1", "--cluster", "dbcli")
	p.fails(exitUsage, "--from", "db", "create", "x", "--cluster", "dbcli")
	p.fails(exitUsage, "unknown strategy", "db", "create", "x", "--from", "template1", "--strategy", "fast", "--cluster", "dbcli")
	p.fails(exitUnsupported, "clone", "db", "create", "x", "--from", "template1", "--strategy", "clone", "--cluster", "dbcli")
	p.fails(exitNotFound, "dbcli2", "db", "create", "x", "--from", "template1", "--cluster", "dbcli2")
	if exists("x") {
		t.Errorf("a failed create left database x")
	}

	// Busy template: named, then --force.
	holder, err := pgx.Connect(ctx, strings.Replace(up.URL, "/postgres?", "/second?", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	p.fails(exitBusy, "pid ", "db", "create", "fourth", "--from", "second", "--wait", "100ms", "--cluster", "dbcli")
	p.ok("db", "create", "fourth", "--from", "second", "--force", "--wait", "0s", "--cluster", "dbcli")

	// --count: NAME_1..NAME_N and the rate.
	code, out, errOut := p.run("db", "create", "w", "--from", "template1", "--count", "5", "--jobs", "2", "--cluster", "dbcli")
	if code != 0 || !strings.Contains(out, "created 5 databases w_1 … w_5") || !strings.Contains(errOut, "dbs/s") || !exists("w_5") {
		t.Errorf("--count: exit %d %q %q", code, out, errOut)
	}

	// Every create is a measurement: stored beside the calibration, and
	// advise's estimates use it.
	if _, err := os.Stat(filepath.Join(home, "calibration", "cluster-dbcli.learned.json")); err != nil {
		t.Errorf("what creations took was not stored: %v", err)
	}
	var learned struct {
		Estimates []struct {
			Observed int `json:"observed"`
		} `json:"estimates"`
	}
	if err := json.Unmarshal([]byte(p.ok("db", "advise", "--from", "second", "--cluster", "dbcli", "--json")), &learned); err != nil ||
		len(learned.Estimates) == 0 || learned.Estimates[0].Observed == 0 {
		t.Errorf("advise does not use the creations observed: %+v %v", learned, err)
	}

	// advise, calibrate (stored for the cluster, then used by advise).
	var adv struct {
		Choice      string `json:"choice"`
		Calibration string `json:"calibration"`
		Estimates   []any  `json:"estimates"`
	}
	if err := json.Unmarshal([]byte(p.ok("db", "advise", "--from", "second", "--cluster", "dbcli", "--json")), &adv); err != nil || adv.Choice == "" || len(adv.Estimates) != 3 {
		t.Errorf("advise --json: %+v %v", adv, err)
	}
	if out := p.ok("db", "advise", "--from", "second", "--cluster", "dbcli"); !strings.Contains(out, "choice: ") || !strings.Contains(out, "reasons:") {
		t.Errorf("advise: %q", out)
	}
	p.ok("db", "calibrate", "--size", "4", "--runs", "1", "--cluster", "dbcli")
	if _, err := os.Stat(filepath.Join(home, "calibration", "cluster-dbcli.json")); err != nil {
		t.Errorf("calibration not stored: %v", err)
	}
	if err := json.Unmarshal([]byte(p.ok("db", "advise", "--from", "second", "--cluster", "dbcli", "--json")), &adv); err != nil || !strings.HasPrefix(adv.Calibration, "calibrated") {
		t.Errorf("advise after calibrate uses %q", adv.Calibration)
	}

	// Snapshots: take, change, restore (refused with a session, then forced), list, remove.
	holder.Close(ctx)
	p.ok("db", "snapshot", "My DB ü", "first snap", "--cluster", "dbcli")
	c2, err := pgx.Connect(ctx, strings.Replace(up.URL, "/postgres?", "/My%20DB%20%C3%BC?", 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Exec(ctx, "CREATE TABLE changed (x int)"); err != nil {
		t.Fatal(err)
	}
	p.fails(exitBusy, "pid ", "db", "restore", "My DB ü", "--cluster", "dbcli")
	code, _, errOut = p.run("db", "restore", "My DB ü", "--force", "--cluster", "dbcli")
	if code != 0 || !strings.Contains(errOut, "refilling spare") {
		t.Errorf("restore --force: exit %d %q", code, errOut)
	}
	c2.Close(ctx)
	c3, err := pgx.Connect(ctx, strings.Replace(up.URL, "/postgres?", "/My%20DB%20%C3%BC?", 1))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = c3.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'changed'").Scan(&n)
	c3.Close(ctx)
	if n != 0 {
		t.Errorf("restore did not undo the change")
	}
	if out := p.ok("db", "snapshots", "--cluster", "dbcli"); !strings.Contains(out, "first snap") || !strings.Contains(out, "ready") {
		t.Errorf("snapshots: %q", out)
	}
	p.ok("db", "rm-snapshot", "first snap", "--cluster", "dbcli")
	p.fails(exitNotFound, "no snapshots", "db", "restore", "My DB ü", "--cluster", "dbcli")
}

// TestDBCreateBounds: --count and --jobs out of range are usage errors
// (exit 2 with a hint) before any connection, never a panic.
func TestDBCreateBounds(t *testing.T) {
	pgBin := testenv.PGBinDirs(t)[0]
	p := &dbCLI{t: t, home: testenv.Dir(t), pgBin: pgBin}
	// No server listens here: a bounds check that came after connecting
	// would fail with another exit code.
	url := "postgres://nobody@127.0.0.1:1/postgres"
	for _, args := range [][]string{
		{"--count", "9223372036854775807"},
		{"--count", "100001"},
		{"--count", "0"},
		{"--count", "3", "--jobs", "0"},
		{"--count", "3", "--jobs", "1000000"},
		{"--jobs", "-1"},
	} {
		code, _, errOut := p.run(append([]string{"db", "create", "w", "--from", "template1", "--url", url}, args...)...)
		if code != exitUsage || !strings.Contains(errOut, "hint:") || strings.Contains(errOut, "panic") {
			t.Errorf("db create %v: exit %d, stderr %q; want exit 2 with a hint", args, code, errOut)
		}
	}
}

// TestDBInterrupted: `db snapshot` and `db create` killed (kill -9) or
// stopped (SIGTERM) while the server copies leave no database under the
// final name, nothing `db snapshots` cannot see or remove, and the same
// command run again succeeds. The copy is held mid-way by a transaction
// that locks the source database (COMMENT ON DATABASE), so the kill always
// lands while CREATE DATABASE runs.
func TestDBInterrupted(t *testing.T) {
	p, url, conn := dbCluster(t, "dbint")
	bin, home, pgBin := p.bin, p.home, p.pgBin
	up := struct{ URL string }{url}
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "CREATE DATABASE src"); err != nil {
		t.Fatal(err)
	}
	dbs := func(like string) []string {
		t.Helper()
		rows, err := conn.Query(ctx, "SELECT datname::text FROM pg_database WHERE datname LIKE $1 ORDER BY 1", like)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	copying := func() int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE DATABASE%' AND pid <> pg_backend_pid()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// interrupt runs pgfork args, holds its CREATE DATABASE on a lock,
	// sends sig, then lets the server go on and waits until it is done.
	interrupt := func(sig syscall.Signal, args ...string) int {
		t.Helper()
		holder, err := pgx.Connect(ctx, up.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close(ctx)
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "COMMENT ON DATABASE src IS 'held'"); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, append([]string{"--state-dir", home, "--pg-bin", pgBin}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitUntil("CREATE DATABASE to start", func() bool { return copying() > 0 })
		_ = cmd.Process.Signal(sig)
		err = cmd.Wait()
		_ = tx.Rollback(ctx)
		waitUntil("the server to finish the copy", func() bool { return copying() == 0 })
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		t.Logf("pgfork %s after %v: exit %d %s", strings.Join(args, " "), sig, code, strings.TrimSpace(stderr.String()))
		return code
	}

	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		snap, db := "s-"+sig.String(), "c-"+sig.String()
		code := interrupt(sig, "db", "snapshot", "src", snap, "--no-spare", "--cluster", "dbint")
		if sig == syscall.SIGTERM && code != exitInterrupted {
			t.Errorf("snapshot after SIGTERM: exit %d, want %d", code, exitInterrupted)
		}
		if sig == syscall.SIGTERM {
			// The command itself removed its work.
			if left := dbs("pgfork\\_%"); len(left) != 0 {
				t.Errorf("SIGTERM left %v", left)
			}
		}
		if out := p.ok("db", "snapshots", "--cluster", "dbint"); strings.Contains(out, snap) {
			t.Errorf("an interrupted snapshot is listed: %q", out)
		}
		if left := dbs("pgfork\\_%"); len(left) != 0 {
			t.Errorf("after %v and db snapshots, left: %v", sig, left)
		}
		p.ok("db", "snapshot", "src", snap, "--no-spare", "--cluster", "dbint")
		p.ok("db", "rm-snapshot", snap, "--cluster", "dbint")

		code = interrupt(sig, "db", "create", db, "--from", "src", "--cluster", "dbint")
		if sig == syscall.SIGTERM && code != exitInterrupted {
			t.Errorf("create after SIGTERM: exit %d, want %d", code, exitInterrupted)
		}
		if got := dbs(db); len(got) != 0 {
			t.Errorf("an interrupted create left database %v", got)
		}
		p.ok("db", "create", db, "--from", "src", "--cluster", "dbint")
		if left := dbs("pgfork\\_%"); len(left) != 0 {
			t.Errorf("after %v and a new create, left: %v", sig, left)
		}
	}
}
