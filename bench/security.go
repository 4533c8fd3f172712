package main

// The security scenario (issue 57) answers one question: did the five rules
// of docs/SECURITY.md (a secret for every route when anything needs one,
// secrets off command lines, a server trusted only once it proves it is
// ours, a foreign cluster's code-loading settings neutralized and its links
// opened as its owner, a branch holding exactly its documented reach) cost
// time on the paths users wait on? It builds pgfork twice, at this checkout
// and at the commit before the rules (PGFORK_BENCH_BEFORE, default
// 6cba427^, the parent of issue 57's first commit), and measures both
// interleaved, round by round, on the same source and filesystem:
//
//   - hand-out: GET a test database from a running serve (IntegreSQL's
//     route), one client, the database given back before the next;
//   - branch create: `pgfork branch create NAME --source cluster:SRC` of a
//     stopped cluster to the first query on the branch (the foreign
//     cluster's settings, its owner's check, the branch role's reach);
//   - clone: `pgfork clone SRC DST` of that stopped cluster (the linked
//     directories opened as their owner, the owner's check).
//
//	PGFORK_BENCH_BEFORE=REV              the commit to compare with (default 6cba427^)
//	PGFORK_BENCH_SECURITY_RUNS=N         rounds (default 15)
//	PGFORK_BENCH_SECURITY_HANDOUTS=N     hand-outs per round and binary (default 50)
//	PGFORK_BENCH_SECURITY_PG_BIN=DIR     PostgreSQL to use (default Debian's 15)
//	PGFORK_TEST_XFS                      the XFS reflink filesystem (scripts/test-env.sh)

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/units"
)

func init() {
	register(Scenario{Name: "security", Issue: "the five rules' cost on hand-out, branch create and clone: this commit vs the one before the rules (issue 57)", Run: runSecurityBench})
}

// securityBin is one of the two builds compared.
type securityBin struct {
	name  string // "before (REV)" or "after (this commit)"
	bin   string
	state string // its own state directory: the two builds' formats may differ
	serve *serveProc
	hash  string
}

func runSecurityBench(ctx context.Context, r *Report) error {
	before := os.Getenv("PGFORK_BENCH_BEFORE")
	if before == "" {
		before = "6cba427^"
	}
	runs := max(copyEnvInt("PGFORK_BENCH_SECURITY_RUNS", 15), 1)
	handouts := max(copyEnvInt("PGFORK_BENCH_SECURITY_HANDOUTS", 50), 1)
	xfs := os.Getenv("PGFORK_TEST_XFS")
	if xfs == "" {
		return fmt.Errorf("PGFORK_TEST_XFS is not set: run eval \"$(scripts/test-env.sh env)\"")
	}
	pg, user, err := benchPostgres("PGFORK_BENCH_SECURITY_PG_BIN")
	if err != nil {
		return err
	}
	work := filepath.Join(xfs, "pgfork-bench-security")
	_ = os.RemoveAll(work)
	if err := user.MkdirOwned(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)

	rev, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", before).Output()
	if err != nil {
		return fmt.Errorf("git rev-parse %s: %v (PGFORK_BENCH_BEFORE names the commit to compare with)", before, err)
	}
	bins := []*securityBin{
		{name: "before (" + strings.TrimSpace(string(rev)) + ")", bin: filepath.Join(work, "pgfork-before")},
		{name: "after (this commit)", bin: filepath.Join(work, "pgfork-after")},
	}
	fmt.Printf("building pgfork at %s and at this checkout...\n", before)
	if err := buildAt(ctx, before, bins[0].bin); err != nil {
		return err
	}
	if out, err := goBuild(ctx, bins[1].bin); err != nil {
		return fmt.Errorf("building pgfork: %v\n%s", err, out)
	}
	for i, b := range bins {
		b.state = filepath.Join(work, fmt.Sprintf("state-%d", i))
		if err := os.Mkdir(b.state, 0o755); err != nil { // the run-as user reaches its clusters in it
			return err
		}
	}

	// The source: a stopped cluster of pgbench scale 10 on XFS, owned by the
	// user PostgreSQL runs as (the common case of `clone` and `branch create`).
	e := &cloneBenchEnv{pg: pg, user: user, scale: 10}
	src, err := e.prepare(ctx, work, "")
	if err != nil {
		return err
	}

	r.Notef("The same rounds for both builds, interleaved (round i starts with build i mod 2), %d rounds; PostgreSQL %s; "+
		"source: a stopped cluster of pgbench scale 10 (%s) on XFS with reflinks; each build has its own state directory on "+
		"that XFS. Hand-out: a serve of each build on its managed cluster, one template, %d hand-outs per round each "+
		"(GET …/tests, then unlock), median per hand-out over all rounds. Branch create: `branch create bN --source cluster:SRC` "+
		"to the first query on the branch, then `branch rm` (untimed). Clone: `clone SRC DST` (offline, default --sync fsync), "+
		"DST removed between runs (untimed). PGFORK_BENCH_BEFORE names the commit compared with.",
		runs, pg.Version, units.Bytes(dirSize(src)), handouts)
	r.Notef("Load average at start: %s.", loadAvg())

	// Hand-out: one serve per build for the whole run.
	for i, b := range bins {
		port, err := instance.FreePort("127.0.0.1")
		if err != nil {
			return err
		}
		p, err := startServe(b.bin, b.state, port, "--managed", "--pg-bin", pg.BinDir)
		if err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		b.serve = p
		defer p.stop()
		b.hash = fmt.Sprintf("5ec0000000000000000000000000000%d", i)
		if err := p.template(ctx, b.hash, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 1000) g"); err != nil {
			return fmt.Errorf("%s: template: %w", b.name, err)
		}
		if _, err := p.waitReady(ctx, 1, 2*time.Minute); err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
	}

	hand := make([]Sample, len(bins))
	branch := make([]Sample, len(bins))
	clone := make([]Sample, len(bins))
	for round := 0; round < runs; round++ {
		for j := range bins {
			k := (round + j) % len(bins)
			b := bins[k]
			if err := ctx.Err(); err != nil {
				return err
			}
			lat, _, err := b.serve.loop(b.hash, 1, handouts, 0, "unlock", nil)
			if err != nil {
				return fmt.Errorf("%s: hand-out: %w", b.name, err)
			}
			hand[k] = append(hand[k], lat...)

			name := fmt.Sprintf("b%d", round)
			t0 := time.Now()
			url, err := securityBranch(ctx, b, pg.BinDir, name, src)
			if err != nil {
				return fmt.Errorf("%s: %w", b.name, err)
			}
			if err := branchFirstQuery(ctx, url); err != nil {
				return fmt.Errorf("%s: first query on branch %s: %w", b.name, name, err)
			}
			branch[k] = append(branch[k], time.Since(t0))
			if out, err := exec.CommandContext(ctx, b.bin, "--state-dir", b.state, "-q", "branch", "rm", name).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: branch rm %s: %v\n%s", b.name, name, err, out)
			}

			dst := filepath.Join(work, "clone")
			_ = os.RemoveAll(dst)
			t0 = time.Now()
			if out, err := exec.CommandContext(ctx, b.bin, "clone", "-q", "--pg-bin", pg.BinDir, src, dst).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: clone: %v\n%s", b.name, err, out)
			}
			clone[k] = append(clone[k], time.Since(t0))
			if err := os.RemoveAll(dst); err != nil {
				return err
			}
		}
	}
	r.Notef("Load average at the end: %s.", loadAvg())

	var rows [][]string
	for _, m := range []struct {
		what string
		s    []Sample
	}{{"hand-out (serve, one client)", hand}, {"branch create to first query", branch}, {"clone SRC DST (offline)", clone}} {
		b, a := m.s[0].Median(), m.s[1].Median()
		rows = append(rows, []string{m.what, Dur(b), Dur(a), Times(a, b), m.s[0].Cell(0.9), m.s[1].Cell(0.9)})
		// "No measurable cost": the median after within 10% of before, or
		// within 1 ms for sub-10 ms paths (the rounds' own spread).
		r.Target(a <= b+b/10 || a-b < time.Millisecond, "%s: after %s vs before %s (%s; target: no measurable cost, ≤ 1.1x)", m.what, Dur(a), Dur(b), Times(a, b))
	}
	r.Table([]string{"path", "before: median", "after: median", "after / before", "before: p90", "after: p90"}, rows)
	return nil
}

// securityBranch creates branch name of the stopped cluster src with build b
// and returns the connection string it prints.
func securityBranch(ctx context.Context, b *securityBin, pgBin, name, src string) (string, error) {
	cmd := exec.CommandContext(ctx, b.bin, "--state-dir", b.state, "--pg-bin", pgBin, "-q", "branch", "create", name, "--source", "cluster:"+src)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return "", fmt.Errorf("branch create %s: %v\n%s%s", name, err, out, stderr)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "postgres") {
			return l, nil
		}
	}
	return "", fmt.Errorf("branch create %s printed no connection string:\n%s", name, out)
}

// buildAt builds ./cmd/pgfork as it was at the commit rev into out, from a
// `git archive` of that commit (the checkout is not touched).
func buildAt(ctx context.Context, rev, out string) error {
	dir, err := os.MkdirTemp("", "pgfork-bench-rev-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	archive := exec.CommandContext(ctx, "sh", "-c", `git archive "$1" | tar -x -C "$2"`, "sh", rev, dir)
	if b, err := archive.CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s: %v\n%s", rev, err, b)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/pgfork")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building pgfork at %s: %v\n%s", rev, err, b)
	}
	return nil
}
