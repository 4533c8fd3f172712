package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/testenv"
)

// leaseServe is a `pgfork serve --lease` started as the clients' glue
// starts it: the starter holds a shared lock on the lease file until let go.
type leaseServe struct {
	*serveProc
	lease *flock.Lock
}

// startLeaseServe starts serve on state directory home for one test run,
// as the clients' glue does (--json, a free port, --lease), with args.
func startLeaseServe(t *testing.T, bin, home, pgBin string, args ...string) *leaseServe {
	t.Helper()
	leaseFile := filepath.Join(home, "test-run.lease")
	lk, err := flock.TryShared(leaseFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"--state-dir", home, "--pg-bin", pgBin, "--json", "serve",
		"--listen", "127.0.0.1:0", "--lease", leaseFile}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &serveProc{cmd: cmd, stderr: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		lk.Unlock()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
	})
	p.base = "http://" + readListenLine(t, bufio.NewReader(out), p.stderr)
	return &leaseServe{serveProc: p, lease: lk}
}

// end lets the lease go, as a test run's last process exiting does, and
// waits for serve to exit; it returns serve's log.
func (s *leaseServe) end(t *testing.T) string {
	t.Helper()
	s.lease.Unlock()
	testenv.WaitFor(t, "serve to exit once the lease was let go", func() bool {
		select {
		case <-s.done:
			return true
		default:
			return false
		}
	})
	if st := s.cmd.ProcessState; st == nil || !st.Success() {
		t.Fatalf("serve: exit %v\n%s", st, s.stderr)
	}
	return s.stderr.String()
}

// testConfig is a test database's connection of a v1 hand-out.
type testConfig struct {
	ID       int `json:"id"`
	Database struct {
		Config struct {
			Host     string `json:"host"`
			Port     int    `json:"port"`
			Username string `json:"username"`
			Password string `json:"password"`
			Database string `json:"database"`
		} `json:"config"`
	} `json:"database"`
}

// useTests runs n tests of template hash on workers at once, as a suite
// does: each takes a database, connects, writes and gives it back to be
// recreated.
func (p *serveProc) useTests(t *testing.T, hash string, n, workers int) {
	t.Helper()
	next := make(chan int)
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				errc <- p.oneTest(hash)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// oneTest is one test of useTests.
func (p *serveProc) oneTest(hash string) error {
	resp, err := http.Get(p.base + "/api/v1/templates/" + hash + "/tests")
	if err != nil {
		return err
	}
	var tc testConfig
	err = json.NewDecoder(resp.Body).Decode(&tc)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		return fmt.Errorf("hand-out: %d %v", resp.StatusCode, err)
	}
	c := tc.Database.Config
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d dbname=%s sslmode=disable", c.Host, c.Port, c.Database))
	if err != nil {
		return err
	}
	cfg.User, cfg.Password = c.Username, c.Password
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", c.Database, err)
	}
	_, err = conn.Exec(ctx, "INSERT INTO items SELECT g, repeat('x', 100) FROM generate_series(1, 100) g")
	_ = conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("write to %s: %w", c.Database, err)
	}
	resp, err = http.Post(fmt.Sprintf("%s/api/v1/templates/%s/tests/%d/recreate", p.base, hash, tc.ID), "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("recreate %d: %d", tc.ID, resp.StatusCode)
	}
	return nil
}

// migrate initializes template hash as a suite's setup does, unless a
// previous run did (423), with a table of rows rows of about 130 bytes.
func (p *serveProc) migrate(t *testing.T, hash string, rows int) {
	t.Helper()
	code, body := p.call(t, "POST", "/api/v1/templates", `{"hash":"`+hash+`"}`)
	if code == http.StatusLocked {
		return
	}
	if code != 200 {
		t.Fatalf("initialize: %d %s", code, body)
	}
	var tc testConfig
	if err := json.Unmarshal([]byte(body), &tc); err != nil {
		t.Fatal(err)
	}
	c := tc.Database.Config
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d dbname=%s sslmode=disable", c.Host, c.Port, c.Database))
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = c.Username, c.Password
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE items (id int, v text); INSERT INTO items SELECT g, repeat('x', 100) FROM generate_series(1, "+strconv.Itoa(rows)+") g"); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	if code, body := p.call(t, "PUT", "/api/v1/templates/"+hash, ""); code != http.StatusNoContent {
		t.Fatalf("finalize: %d %s", code, body)
	}
}

// ready is how many databases the pool of template hash has ready (the
// pgfork_pool_databases metric).
func (p *serveProc) ready(t *testing.T, hash string) int {
	t.Helper()
	re := regexp.MustCompile(`pgfork_pool_databases\{state="ready",template="` + regexp.QuoteMeta(hash) + `"\} (\d+)`)
	_, body := p.call(t, "GET", "/metrics", "")
	if m := re.FindStringSubmatch(body); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

// testDatabases counts the databases of the stopped managed cluster in
// home that are not PostgreSQL's own (template0, template1, postgres) nor
// templates: one directory of its base each.
func testDatabases(t *testing.T, home string, templates int) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(managedData(t, home), "base"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); e.IsDir() && err == nil {
			n++
		}
	}
	return n - 3 - templates
}

// diskUsage is the disk the files under dir take.
func diskUsage(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// leftRe is what serve's stop says it left for the next start.
var leftRe = regexp.MustCompile(`(\d+) left for the next start to drop`)

// leftOf is the number of test databases serve's log says its stop left.
func leftOf(log string) int {
	n := 0
	for _, m := range leftRe.FindAllStringSubmatch(log, -1) {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	return n
}

// TestServeStateBoundedRunOverRun (issue 58): a serve started for test
// runs (--lease, as the clients' glue starts it) on one state directory,
// each run handing out, writing to and giving back 40 databases and then
// ending, leaves no more test databases run after run. A stop comes a
// second after the run's last test (the lease's grace), before the pool
// counts the run as ended; the used copies are dropped in the background
// as they are given back (pool's emptiers), so a stop leaves at most what
// the run gave back and has not been dropped yet: never more than the run's
// own, and the next start drops them before it serves, so nothing adds up
// over runs. The cluster holds no more than that besides the copies made
// ready for the next run (its demand, the run's size). How many a stop
// leaves depends on the machine's load (no verdict on it: it is logged).
//
// Before, every used copy of a run the ready ones covered waited under its
// name for the run's end, which the stop came before; on this machine a
// stop left 31 of 40 for the next start (state 532 MB) and another 26 (the
// stop spent its budget waiting for copies being made): 2 series of 3
// failed, the third passed (what a stop manages to drop in its budget
// depends on the machine's load).
func TestServeStateBoundedRunOverRun(t *testing.T) {
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]
	const (
		runs    = 4
		tests   = 40 // a run's tests, each with a database of its own
		workers = 4
	)
	leftBound := tests // the run's own used copies at most: nothing of an earlier run
	var counts, lefts []int
	for run := 1; run <= runs; run++ {
		s := startLeaseServe(t, bin, home, pgBin, "--copies", "databases")
		// Copies of 19 MB (PostgreSQL 15): their drops take long enough
		// that a stop cannot drop a whole run's.
		s.migrate(t, "bounded", 80000)
		if run > 1 {
			// As a suite's build gives it time: the pool has filled to
			// the demand the first run taught it.
			testenv.WaitFor(t, "the pool to fill to the first run's demand", func() bool { return s.ready(t, "bounded") >= tests })
		}
		s.useTests(t, "bounded", tests, workers)
		log := s.end(t)
		n, left := testDatabases(t, home, 1), leftOf(log)
		counts, lefts = append(counts, n), append(lefts, left)
		t.Logf("run %d: %d test databases in the cluster after the stop, %d left for the next start to drop, state %.1f MB",
			run, n, left, float64(diskUsage(t, home))/1e6)
		if left > leftBound {
			t.Errorf("run %d: the stop left %d test databases for the next start to drop, want at most %d\n%s", run, left, leftBound, log)
		}
		if n > tests+leftBound {
			t.Errorf("run %d: %d test databases in the cluster after the stop, want at most %d (the run's %d, ready for the next, and %d)\n%s",
				run, n, tests+leftBound, tests, leftBound, log)
		}
	}
	t.Logf("test databases after each stop: %v; left for the next start: %v", counts, lefts)
}

// handOutConn is a connection to database db of the managed server as
// the role a hand-out of template hash names (the managed superuser); the
// database handed out to find it is given back.
func (p *serveProc) handOutConn(t *testing.T, hash, db string) *pgx.Conn {
	t.Helper()
	code, body := p.call(t, "GET", "/api/v1/templates/"+hash+"/tests", "")
	if code != 200 {
		t.Fatalf("hand-out: %d %s", code, body)
	}
	var tc testConfig
	if err := json.Unmarshal([]byte(body), &tc); err != nil {
		t.Fatal(err)
	}
	c := tc.Database.Config
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d dbname=%s sslmode=disable", c.Host, c.Port, db))
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = c.Username, c.Password
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if code, body := p.call(t, "POST", fmt.Sprintf("/api/v1/templates/%s/tests/%d/recreate", hash, tc.ID), ""); code != http.StatusNoContent {
		t.Fatalf("recreate: %d %s", code, body)
	}
	return conn
}

// TestServeDiskCap (issue 58): with --max-disk, the test databases of
// the state directory (ready ones, those in use, those given back and
// waiting to be made again, used copies waiting for their drop) never
// take more than the cap plus one copy, while a suite hands out, writes
// to and gives back more databases than fit, over two runs (the second
// with the demand the first taught the pool); every test still gets its
// database.
func TestServeDiskCap(t *testing.T) {
	bin := pgforkBinary(t)
	home := testenv.Dir(t)
	pgBin := testenv.PGBinDirs(t)[0]
	const (
		capBytes = 48 << 20
		tests    = 30
		workers  = 4
	)
	for run := 1; run <= 2; run++ {
		s := startLeaseServe(t, bin, home, pgBin, "--copies", "databases", "--max-disk", "48MiB")
		s.migrate(t, "capped", 10000) // copies of 9 MB
		conn := s.handOutConn(t, "capped", "postgres")
		ctx := context.Background()
		var tplBytes int64
		if err := conn.QueryRow(ctx, "SELECT pg_database_size(datname) FROM pg_database WHERE starts_with(datname, 'pgfork_template_')").Scan(&tplBytes); err != nil {
			t.Fatal(err)
		}
		if tplBytes*6 < capBytes {
			t.Fatalf("the template takes %d bytes: too small for the cap of %d to bind", tplBytes, capBytes)
		}
		// Samples the test databases' total size until the suite ends.
		var (
			most    int64
			samples int
		)
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				default:
				}
				var n int64
				// A database dropped meanwhile fails the sample: the next one counts.
				if err := conn.QueryRow(ctx, `SELECT coalesce(sum(pg_database_size(oid)), 0) FROM pg_database
					WHERE starts_with(datname, 'pgfork_test_')`).Scan(&n); err == nil {
					most = max(most, n)
					samples++
				}
			}
		}()
		s.useTests(t, "capped", tests, workers)
		close(stop)
		<-sampled
		_ = conn.Close(ctx)
		t.Logf("run %d: the test databases took at most %.1f MB in %d samples (cap %.1f MB, a copy %.1f MB)",
			run, float64(most)/1e6, samples, float64(capBytes)/1e6, float64(tplBytes)/1e6)
		if samples == 0 {
			t.Fatal("no sample of the test databases' size")
		}
		if most > capBytes+tplBytes {
			t.Errorf("run %d: the test databases took %d bytes, over the cap of %d plus one copy (%d)", run, most, capBytes, tplBytes)
		}
		s.end(t)
	}
}
