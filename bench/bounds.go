package main

import (
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/pgbin"
)

// Lower bounds measured in the same run as the targets they bound: what no
// contender of a section can beat on this machine, so that a missed target
// says whether pgfork or the machine is short.

// cpuTimes is a snapshot of the machine's CPU time (/proc/stat's cpu line,
// in clock ticks): busy (all but idle and iowait) and total.
type cpuTimes struct{ busy, total uint64 }

// readCPU reads the snapshot; zero where /proc/stat is missing (not Linux).
func readCPU() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t
}

// busySince is the share of all cores kept busy since before (0 to 1; -1
// when not measured).
func (t cpuTimes) busySince(before cpuTimes) float64 {
	if t.total <= before.total || before.total == 0 {
		return -1
	}
	return float64(t.busy-before.busy) / float64(t.total-before.total)
}

// busyCell formats a busy share for a table ("—" when not measured).
func busyCell(share float64) string {
	if share < 0 {
		return "—"
	}
	return strconv.Itoa(int(share*100+0.5)) + "%"
}

// newBackendCost times, n times each in turns, a test's statements on a new
// connection to the database at url (connect, stmts, close: a new backend,
// its authentication and its cold caches) and the same statements on one
// open connection. Their difference is what any fresh database per test
// pays at least per test: a PostgreSQL backend serves one database.
func newBackendCost(ctx context.Context, url string, stmts []string, n int) (fresh, open Sample, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(ctx)
	run := func(c *pgx.Conn) error {
		for _, s := range stmts {
			if _, err := c.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
	s, err := MeasureInterleaved(n,
		Case{Fn: func(int) error {
			c, err := pgx.Connect(ctx, url)
			if err != nil {
				return err
			}
			defer c.Close(ctx)
			return run(c)
		}},
		Case{Fn: func(int) error { return run(conn) }})
	if err != nil {
		return nil, nil, err
	}
	return s[0], s[1], nil
}

// creationBound is the least time a run that takes need fresh databases,
// ready of them made before it began, spends creating the others at the
// bare CREATE DATABASE rate (databases a second, measured idle): the run
// cannot end sooner even if its tests took no time.
func creationBound(need, ready int, bare float64) time.Duration {
	if bare <= 0 || need <= ready {
		return 0
	}
	return time.Duration(float64(need-ready) / bare * float64(time.Second))
}

// clusterRun is what bareClusters measured: per cluster copy, the wall
// time (n at once) and the time of all the cores.
type clusterRun struct {
	copies int
	wall   time.Duration // all copies, n at once
	busy   float64       // share of the cores busy meanwhile (-1: not measured)
	files  int           // files in the copied data directory
	// cpu is the CPU time the copies' own processes took (cp, the
	// servers and their backends, rm), all copies: unlike busy, it leaves
	// out what other work ran on the machine meanwhile, and what the
	// kernel's own threads did for them (the filesystem's background
	// work, such as freeing the removed inodes).
	cpu time.Duration
}

// processCPU is the CPU time one bare copy's processes took (0 when not
// measured).
func (c clusterRun) processCPU() time.Duration {
	if c.copies == 0 {
		return 0
	}
	return c.cpu / time.Duration(c.copies)
}

// childrenCPU is the CPU time (user + system) of this process's children
// that have ended and been waited for.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// selfCPU is the CPU time (user + system) of this process (the bench: its
// tests' clients).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// coreTime is the time of all the cores one bare cluster copy took (0 when
// not measured).
func (c clusterRun) coreTime() time.Duration {
	if c.copies == 0 || c.busy < 0 {
		return 0
	}
	return time.Duration(c.busy * float64(runtime.NumCPU()) * float64(c.wall) / float64(c.copies))
}

// bareClusters makes k bare copies of the stopped cluster data, n at once,
// as little as any test cluster costs: `cp -a --reflink=always` (the
// coreutils copy, no pgfork code), the server started on the copy (pgBin,
// as user, the test profile, no TCP), one connection to each of its
// databases, the server stopped immediately, and the copy removed (`rm
// -rf`). Each copy goes beside data's parent directory (the same
// filesystem, so the reflink works).
//
// The connections: a server's start removes every database's relation
// cache file (pg_internal.init), so the first connection to each database
// of a new test cluster reads its catalogs to build its caches, which
// later connections then read from the file. A test gets a fresh database
// and connects to it, so every database of every test cluster pays that
// once, whoever makes the cluster, and the suite's floor (its databases
// reused, their caches built) does not: until 2026-12-07 the bound left it
// out.
func bareClusters(ctx context.Context, data string, pg pgbin.Installation, user *instance.OSUser, k, n int) (clusterRun, error) {
	files := 0
	_ = filepath.WalkDir(data, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files++
		}
		return nil
	})
	base := filepath.Dir(filepath.Dir(data))
	p0 := childrenCPU()
	c0 := readCPU()
	s0 := time.Now()
	err := parallel(k, n, func(i int) error {
		return bareCluster(ctx, data, filepath.Join(base, fmt.Sprintf("bench-bare-cluster-%d", i)), pg, user)
	})
	run := clusterRun{copies: k, wall: time.Since(s0), busy: readCPU().busySince(c0), files: files, cpu: childrenCPU() - p0}
	if err != nil {
		return clusterRun{}, err
	}
	return run, nil
}

// bareCluster is one of bareClusters' copies.
func bareCluster(ctx context.Context, data, dst string, pg pgbin.Installation, user *instance.OSUser) error {
	defer os.RemoveAll(dst) // after a failure; the timed removal is rm's
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=always", data, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp --reflink=always: %v: %s", err, out)
	}
	// A stopped copy of a stopped cluster: its pid file is not there.
	in, err := instance.Start(ctx, instance.Config{BinDir: pg.BinDir, Env: pg.Env(), DataDir: dst, User: user, Profile: instance.Test,
		Settings: map[string]string{"shared_buffers": "16MB"}})
	if err != nil {
		return err
	}
	if err := connectEach(ctx, in); err != nil {
		_ = in.Stop(ctx, instance.Immediate)
		return err
	}
	if err := in.Stop(ctx, instance.Immediate); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "rm", "-rf", dst).CombinedOutput(); err != nil {
		return fmt.Errorf("rm -rf: %v: %s", err, out)
	}
	return nil
}

// connectEach connects once to each database of server in that accepts
// connections but template1, as the bootstrap superuser over its socket:
// the databases of a test cluster of serve's (postgres, its admin
// connection's, and the test databases; template1 is only copied).
func connectEach(ctx context.Context, in *instance.Instance) error {
	connect := func(db string) (*pgx.Conn, error) {
		q := url.Values{"host": {in.SocketDir}, "port": {strconv.Itoa(in.Port)}, "user": {"postgres"}, "dbname": {db}}
		return pgx.Connect(ctx, "postgres:///?"+instance.EncodeQuery(q))
	}
	c, err := connect("postgres")
	if err != nil {
		return err
	}
	rows, err := c.Query(ctx, "SELECT datname FROM pg_database WHERE datallowconn AND datname NOT IN ('template1', 'postgres')")
	var dbs []string
	if err == nil {
		dbs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	c.Close(ctx)
	if err != nil {
		return err
	}
	for _, db := range dbs {
		c, err := connect(db)
		if err != nil {
			return err
		}
		c.Close(ctx)
	}
	return nil
}

// templateCluster finds the stopped cluster of the one template serve
// keeps under home (cloned clusters: …/clusters/templates/<name>/data) and
// how many test databases each copy of it holds (its databases but
// template1 and postgres: the template's and its slots).
func templateCluster(home string) (data string, slots int, err error) {
	for depth := 0; depth <= 4; depth++ {
		pat := filepath.Join(append(append([]string{home}, repeatStar(depth)...), "clusters", "templates", "*", "data", "PG_VERSION")...)
		m, _ := filepath.Glob(pat)
		if len(m) == 1 {
			data = filepath.Dir(m[0])
			ents, err := os.ReadDir(filepath.Join(data, "base"))
			if err != nil {
				return "", 0, err
			}
			dbs := 0
			for _, e := range ents { // base/<oid>: pgsql_tmp is no database
				if _, err := strconv.ParseUint(e.Name(), 10, 32); err == nil && e.IsDir() {
					dbs++
				}
			}
			return data, dbs - 2, nil
		}
		if len(m) > 1 {
			return "", 0, fmt.Errorf("%d template clusters under %s, expected one", len(m), home)
		}
	}
	return "", 0, fmt.Errorf("no template cluster under %s", home)
}

func repeatStar(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = "*"
	}
	return s
}

// clusterBound is the least time a run of tests that take need fresh
// databases, ready of them made before it began, needs on the cores when
// each cluster of slots databases costs what a bare copy c cost and the
// tests themselves what the floor's run took of the cores (floorCore):
// the clusters it must copy and the tests' work, over the cores kept busy.
func clusterBound(need, ready, slots int, c clusterRun, floorCore time.Duration) (clusters int, least time.Duration) {
	if slots < 1 || need <= ready || c.coreTime() <= 0 {
		return 0, 0
	}
	clusters = (need - ready + slots - 1) / slots
	return clusters, (time.Duration(clusters)*c.coreTime() + floorCore) / time.Duration(runtime.NumCPU())
}

// treeCPU is the CPU time (user + system, in clock ticks) of a process and
// its descendants: self is the process's own; children what its children
// took, the ones it has reaped (cutime, cstime: with what their own reaped
// children took) and the ones still running (with their descendants).
type treeCPU struct{ self, children uint64 }

// clockTick is the kernel's USER_HZ, the unit of /proc/PID/stat's times
// (100 on every Linux architecture Go supports).
const clockTick = 100

// readTreeCPU reads the CPU time of process pid and its descendants (zero
// where /proc is missing).
func readTreeCPU(pid int) treeCPU {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return treeCPU{}
	}
	type stat struct {
		ppid      int
		own, kids uint64 // utime+stime, cutime+cstime
	}
	all := map[int]stat{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')') // the command name may hold anything
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
		if len(f) < 15 {
			continue
		}
		var v [4]uint64
		for k := range v {
			v[k], _ = strconv.ParseUint(f[11+k], 10, 64) // fields 14-17
		}
		ppid, _ := strconv.Atoi(f[1])
		all[p] = stat{ppid: ppid, own: v[0] + v[1], kids: v[2] + v[3]}
	}
	root, ok := all[pid]
	if !ok {
		return treeCPU{}
	}
	t := treeCPU{self: root.own, children: root.kids}
	var add func(parent int)
	add = func(parent int) {
		for p, s := range all {
			if s.ppid == parent && p != parent {
				t.children += s.own + s.kids
				add(p)
			}
		}
	}
	add(pid)
	return t
}

// since is the CPU time the tree took since before, as durations: the
// process's own and its descendants'.
func (t treeCPU) since(before treeCPU) (self, children time.Duration) {
	d := func(a, b uint64) time.Duration {
		if a < b {
			return 0
		}
		return time.Duration(a-b) * time.Second / clockTick
	}
	return d(t.self, before.self), d(t.children, before.children)
}
