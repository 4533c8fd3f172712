package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The "django" scenario (issue 23) runs a generated Django project (12 apps,
// 80 models, 150 migrations, 400 tests: 300 TestCase, 100
// TransactionTestCase) with `manage.py test --timing` against one
// PostgreSQL 18, side by side: Django's own runner (first run, --keepdb
// second run, --parallel 4) and pgfork.django.Runner with pgfork serve on
// the same server (first run building the template, second run, --parallel
// 4), and the TransactionTestCase part alone (flush vs a fresh database per
// test). Times are Django's own --timing records ("Total database setup",
// "Cloning 'default'") and "Ran N tests in X s". The floor (issue 33): the
// stock runner on a database made once and kept (--keepdb; --parallel 4
// --keepdb: one per worker), TransactionTestCase not flushed (no
// isolation); pgfork's second runs are measured against it. Issue 34's
// zero-setup second run (the runner starting pgfork serve itself) is
// measured when the runner does so.
//
// The same suite runs with pytest-django (stock: --create-db, --reuse-db,
// -n 4; and with -p pgfork.django.pytest_plugin), compared by wall time.
//
// Python: $PGFORK_BENCH_PYTHON (with pgfork[test] installed: Django,
// pytest-django, pytest-xdist), else a venv under the user cache directory,
// made with pip from clients/python[test].
// Scale: PGFORK_BENCH_DJANGO_REPS (default 3) runs per mode;
// PGFORK_BENCH_DJANGO_CLASSES (default 40) classes of 10 tests;
// PGFORK_BENCH_DJANGO_PYTEST=0 skips the pytest-django part.
func init() {
	register(Scenario{Name: "django", Issue: "Django test runner: templates, pool databases per worker, fresh TransactionTestCase databases (issue 23)", Run: runDjangoBench})
}

const (
	djApps       = 12
	djModels     = 80
	djMigrations = 150
)

var (
	djTestCases = 30 // classes of 10 tests
	djTxCases   = 10 // classes of 10 tests
)

// PGFORK_BENCH_DJANGO_CLASSES scales the suite down (a trial run): that
// many classes of 10 tests, a quarter of them TransactionTestCase.
func init() {
	if n, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_DJANGO_CLASSES")); err == nil && n >= 2 {
		djTxCases = max(n/4, 1)
		djTestCases = n - djTxCases
	}
}

// djTestHeader starts each app's tests.py. With BENCH_FLOOR=1 the suite runs
// as its floor (issue 33): the database made once and kept (--keepdb), a
// TransactionTestCase not flushed after its test (no isolation: rows stay,
// so a test checks its row is there rather than alone).
const djTestHeader = `import os

from django.test import TestCase, TransactionTestCase, tag

from app%02d.models import M01

FLOOR = os.environ.get("BENCH_FLOOR") == "1"

if FLOOR:
    class TransactionTestCase(TransactionTestCase):
        def _fixture_teardown(self):
            pass


def check(test):
    n = M01.objects.count()
    if FLOOR:
        test.assertGreaterEqual(n, 1)
    else:
        test.assertEqual(n, 1)
`

// djProject writes the generated project under dir.
func djProject(dir string) error {
	files := map[string]string{}
	files["manage.py"] = "import os, sys\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'benchproject.settings')\nfrom django.core.management import execute_from_command_line\nexecute_from_command_line(sys.argv)\n"
	files["benchproject/__init__.py"] = ""
	var apps []string
	for a := 1; a <= djApps; a++ {
		apps = append(apps, fmt.Sprintf("%q", fmt.Sprintf("app%02d", a)))
	}
	files["benchproject/settings.py"] = `import os
SECRET_KEY = "bench"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", ` + strings.Join(apps, ", ") + `]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "bench",
    "HOST": os.environ["BENCH_PGHOST"], "PORT": os.environ["BENCH_PGPORT"],
    "USER": os.environ["BENCH_PGUSER"], "PASSWORD": os.environ["BENCH_PGPASSWORD"]}}
if os.environ.get("BENCH_FLOOR") == "1":  # the floor's kept database: its rows stay
    DATABASES["default"]["TEST"] = {"NAME": "test_bench_floor"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TEST_RUNNER = os.environ.get("BENCH_RUNNER", "django.test.runner.DiscoverRunner")
PGFORK = {"EXTRA_KEY": os.environ.get("BENCH_EXTRA_KEY", "")}
`
	model := 0
	migration := 0
	for a := 1; a <= djApps; a++ {
		app := fmt.Sprintf("app%02d", a)
		n := djModels / djApps // 6, the first apps one more
		if a <= djModels%djApps {
			n++
		}
		m := djMigrations / djApps // 12, the first apps one more
		if a <= djMigrations%djApps {
			m++
		}
		model += n
		migration += m
		added := make([][]string, n) // fields added by migrations 2..m, per model
		for i := 2; i <= m; i++ {
			k := (i - 2) % n
			added[k] = append(added[k], fmt.Sprintf("x%02d", i))
		}
		var mb, init strings.Builder
		mb.WriteString("from django.db import models\n\n")
		init.WriteString("from django.db import migrations, models\nimport django.db.models.deletion\n\n\nclass Migration(migrations.Migration):\n    initial = True\n    dependencies = []\n    operations = [\n")
		for k := 0; k < n; k++ {
			fmt.Fprintf(&mb, "\nclass M%02d(models.Model):\n    name = models.CharField(max_length=100, db_index=True)\n    score = models.IntegerField(default=0)\n    created = models.DateTimeField(auto_now_add=True)\n", k+1)
			fmt.Fprintf(&init, "        migrations.CreateModel(name=\"M%02d\", fields=[\n            (\"id\", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name=\"ID\")),\n            (\"name\", models.CharField(db_index=True, max_length=100)),\n            (\"score\", models.IntegerField(default=0)),\n            (\"created\", models.DateTimeField(auto_now_add=True)),\n", k+1)
			if k > 0 {
				fmt.Fprintf(&mb, "    parent = models.ForeignKey(M%02d, null=True, on_delete=models.CASCADE)\n", k)
				fmt.Fprintf(&init, "            (\"parent\", models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, to=\"%s.m%02d\")),\n", app, k)
			}
			init.WriteString("        ]),\n")
			for _, f := range added[k] {
				fmt.Fprintf(&mb, "    %s = models.IntegerField(default=0)\n", f)
			}
		}
		init.WriteString("    ]\n")
		files[app+"/__init__.py"] = ""
		files[app+"/models.py"] = mb.String()
		files[app+"/migrations/__init__.py"] = ""
		files[app+"/migrations/0001_initial.py"] = init.String()
		prev := "0001_initial"
		for i := 2; i <= m; i++ {
			k := (i - 2) % n
			name := fmt.Sprintf("%04d_m%02d_x%02d", i, k+1, i)
			files[app+"/migrations/"+name+".py"] = fmt.Sprintf("from django.db import migrations, models\n\n\nclass Migration(migrations.Migration):\n    dependencies = [(%q, %q)]\n    operations = [migrations.AddField(model_name=\"m%02d\", name=\"x%02d\", field=models.IntegerField(default=0))]\n", app, prev, k+1, i)
			prev = name
		}
	}
	if model != djModels || migration != djMigrations {
		return fmt.Errorf("generated %d models and %d migrations, want %d and %d", model, migration, djModels, djMigrations)
	}
	tests := map[int]*strings.Builder{}
	for c := 0; c < djTestCases+djTxCases; c++ {
		a := c%djApps + 1
		b := tests[a]
		if b == nil {
			b = &strings.Builder{}
			fmt.Fprintf(b, djTestHeader, a)
			tests[a] = b
		}
		base, deco := "TestCase", ""
		if c >= djTestCases {
			base, deco = "TransactionTestCase", "\n@tag(\"tx\")"
		}
		fmt.Fprintf(b, "\n%s\nclass C%02d(%s):\n", deco, c, base)
		for t := 0; t < 10; t++ {
			fmt.Fprintf(b, "    def test_%02d(self):\n        M01.objects.create(name=\"t%d\", score=%d)\n        check(self)\n\n", t, t, t)
		}
	}
	for a, b := range tests {
		files[fmt.Sprintf("app%02d/tests.py", a)] = b.String()
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// djPython returns a Python with pgfork[django]: $PGFORK_BENCH_PYTHON, else a
// venv in the user cache directory (re-made when pyproject.toml changes).
func djPython(ctx context.Context, clientsPy string) (string, error) {
	if p := os.Getenv("PGFORK_BENCH_PYTHON"); p != "" {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	venv := filepath.Join(cache, "pgfork-bench-django", "venv")
	py := filepath.Join(venv, "bin", "python")
	pyproject, err := os.ReadFile(filepath.Join(clientsPy, "pyproject.toml"))
	if err != nil {
		return "", err
	}
	want := fmt.Sprintf("%x %s", sha256.Sum256(pyproject), clientsPy)
	stamp := filepath.Join(venv, ".pgfork-stamp")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return py, nil
	}
	_ = os.RemoveAll(venv)
	if out, err := exec.CommandContext(ctx, "python3", "-m", "venv", venv).CombinedOutput(); err != nil {
		return "", fmt.Errorf("python3 -m venv: %v: %s", err, out)
	}
	if out, err := exec.CommandContext(ctx, py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", clientsPy+"[test]").CombinedOutput(); err != nil {
		return "", fmt.Errorf("pip install clients/python[test]: %v: %s", err, out)
	}
	return py, os.WriteFile(stamp, []byte(want), 0o644)
}

// djRun is one `manage.py test --timing` run's figures.
type djRun struct {
	wall, setup, clones, tests time.Duration
	workers                    time.Duration // pgfork: the worker databases taken from the pool
	ran                        int
}

var (
	djTook = regexp.MustCompile(`(?m)^(Total database setup|  Cloning '[^']+'|  pgfork worker \d+'s database for '[^']+') took ([0-9.]+)s`)
	djRan  = regexp.MustCompile(`(?m)^Ran (\d+) tests? in ([0-9.]+)s`)
)

func djSeconds(s string) time.Duration {
	f, _ := strconv.ParseFloat(s, 64)
	return time.Duration(f * float64(time.Second))
}

func djManage(ctx context.Context, py, proj string, env []string, args ...string) (djRun, error) {
	cmd := exec.CommandContext(ctx, py, append([]string{"manage.py", "test", "--noinput", "--timing"}, args...)...)
	cmd.Dir = proj
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), env...)
	wall, out, err := runSuite(cmd, "\nOK")
	r := djRun{wall: wall}
	if err != nil {
		return r, err
	}
	for _, m := range djTook.FindAllStringSubmatch(out, -1) {
		switch {
		case m[1] == "Total database setup":
			r.setup += djSeconds(m[2])
		case strings.HasPrefix(m[1], "  pgfork worker"):
			r.workers += djSeconds(m[2])
		default:
			r.clones += djSeconds(m[2])
		}
	}
	if m := djRan.FindStringSubmatch(out); m != nil {
		r.ran, _ = strconv.Atoi(m[1])
		r.tests = djSeconds(m[2])
	}
	return r, nil
}

// djPytest runs the suite with pytest-django and returns the wall time.
func djPytest(ctx context.Context, py, proj string, env []string, args ...string) (time.Duration, error) {
	all := append([]string{"-m", "pytest", "-p", "no:cacheprovider", "-q", "--ds", "benchproject.settings", "-o", "python_files=tests.py"}, args...)
	cmd := exec.CommandContext(ctx, py, all...)
	cmd.Dir = proj
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), env...)
	took, _, err := runSuite(cmd, fmt.Sprintf("%d passed", (djTestCases+djTxCases)*10))
	return took, err
}

func runDjangoBench(ctx context.Context, r *Report) error {
	r.Notef("Load average at start: %s (2 cores shared with other work; times grow with contention).", loadAvg())
	defer func() { r.Notef("Load average at the end: %s.", loadAvg()) }()
	reps := 3
	if v, err := strconv.Atoi(os.Getenv("PGFORK_BENCH_DJANGO_REPS")); err == nil && v > 0 {
		reps = v
	}
	if reps != 3 || djTestCases+djTxCases != 40 {
		r.Notef("SCALED DOWN for time: %d runs per mode (default 3), %d test classes (default 40): a trial, not the report.", reps, djTestCases+djTxCases)
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	py, err := djPython(ctx, filepath.Join(wd, "clients", "python"))
	if err != nil {
		return err
	}
	version, _ := exec.CommandContext(ctx, py, "-c", "import django; print(django.get_version())").Output()
	tmp, bin, err := clientWorkspace("pgfork-bench-django-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	proj := filepath.Join(tmp, "project")
	if err := djProject(proj); err != nil {
		return err
	}
	_, pg, stopPG, err := benchPG18(ctx, os.TempDir())
	if err != nil {
		return err
	}
	defer stopPG()
	r.Notef("Project: %d apps, %d models (each with an indexed name, a foreign key to the previous model of its app, and the fields its migrations add), "+
		"%d migrations (one CreateModel migration per app, then AddField), django.contrib.auth and contenttypes; %d tests: %d TestCase and %d TransactionTestCase "+
		"(tagged tx), in %d classes; each test inserts a row and counts. Django %s, PostgreSQL 18 (test profile) on ext4 in %s, `manage.py test --noinput --timing`; "+
		"setup is Django's own \"Total database setup\" record, clones its \"Cloning 'default'\" records.",
		djApps, djModels, djMigrations, (djTestCases+djTxCases)*10, djTestCases*10, djTxCases*10, djTestCases+djTxCases, strings.TrimSpace(string(version)), os.TempDir())

	stateDir := filepath.Join(tmp, "state")
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	port := 17000 + os.Getpid()%1000*3
	// serve's own pool sizes (issue 33): a pinned --pool-init turns off
	// the learning of the demand.
	srv, err := startServeEnv(bin, stateDir, port, []string{"PGFORK_PG_URL=" + pg.url})
	if err != nil {
		return err
	}
	defer func() { _ = srv.stop() }()
	dbEnv := []string{"BENCH_PGHOST=" + pg.host, "BENCH_PGPORT=" + strconv.Itoa(pg.port), "BENCH_PGUSER=" + pg.user, "BENCH_PGPASSWORD=" + pg.password}
	stock := append(append([]string{}, dbEnv...), "BENCH_RUNNER=django.test.runner.DiscoverRunner")
	key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	pgforkEnv := func(k string) []string {
		return append(append([]string{}, dbEnv...), "BENCH_RUNNER=pgfork.django.Runner", "PGFORK_URL="+srv.base, "PGFORK_TOKEN=", "BENCH_EXTRA_KEY="+k)
	}

	type mode struct {
		name string
		runs []djRun
	}
	var modes []*mode
	measure := func(name string, n int, prime func() error, env func(i int) []string, args ...string) (*mode, error) {
		m := &mode{name: name}
		if prime != nil {
			if err := prime(); err != nil {
				return nil, err
			}
		}
		for i := 0; i < n; i++ {
			res, err := djManage(ctx, py, proj, env(i), args...)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			m.runs = append(m.runs, res)
		}
		modes = append(modes, m)
		return m, nil
	}
	same := func(e []string) func(int) []string { return func(int) []string { return e } }
	stockFirst, err := measure("Django, first run (create + migrate)", reps, nil, same(stock))
	if err != nil {
		return err
	}
	stockKeep, err := measure("Django, --keepdb (second run)", reps, func() error {
		_, err := djManage(ctx, py, proj, stock, "--keepdb")
		return err
	}, same(stock), "--keepdb")
	if err != nil {
		return err
	}
	stockPar, err := measure("Django, --parallel 4 (first run: create, migrate, 4 clones)", reps, nil, same(stock), "--parallel", "4")
	if err != nil {
		return err
	}
	stockTx, err := measure("Django, TransactionTestCase part (--tag tx --keepdb: flush)", reps, nil, same(stock), "--tag", "tx", "--keepdb")
	if err != nil {
		return err
	}
	pgFirst, err := measure("pgfork, first run (template built)", reps, nil, func(i int) []string { return pgforkEnv(fmt.Sprintf("%s-first-%d", key, i)) })
	if err != nil {
		return err
	}
	pgSecond, err := measure("pgfork, second run (template reused)", reps, func() error {
		_, err := djManage(ctx, py, proj, pgforkEnv(key))
		return err
	}, same(pgforkEnv(key)))
	if err != nil {
		return err
	}
	pgPar, err := measure("pgfork, --parallel 4 (template reused)", reps, nil, same(pgforkEnv(key)), "--parallel", "4")
	if err != nil {
		return err
	}
	pgTx, err := measure("pgfork, TransactionTestCase part (--tag tx: fresh databases)", reps, nil, same(pgforkEnv(key)), "--tag", "tx")
	if err != nil {
		return err
	}

	// The floor (issue 33): the stock runner on a database made once and
	// kept, TransactionTestCase not flushed (BENCH_FLOOR=1).
	floorEnv := append(append([]string{}, stock...), "BENCH_FLOOR=1")
	floorSerial, err := measure("floor: Django --keepdb, no flush (one database made once)", reps, func() error {
		_, err := djManage(ctx, py, proj, floorEnv, "--keepdb")
		return err
	}, same(floorEnv), "--keepdb")
	if err != nil {
		return err
	}
	floorPar, err := measure("floor: Django --parallel 4 --keepdb, no flush (each worker reuses one database)", reps, func() error {
		_, err := djManage(ctx, py, proj, floorEnv, "--parallel", "4", "--keepdb")
		return err
	}, same(floorEnv), "--parallel", "4", "--keepdb")
	if err != nil {
		return err
	}
	bare, err := bareCreateRate(ctx, pg.db("test_bench_floor"), 4, 40)
	if err != nil {
		return fmt.Errorf("bare CREATE DATABASE: %w", err)
	}
	// Issue 34: one app's tests with nothing started by hand, twice; the
	// setup is Django's own record.
	zFirst, zSecond, _, zLeft, zNot := zeroSetup(ctx, bin, tmp, srv, 0, nil, func(env []string) (time.Duration, error) {
		zenv := append(append(append([]string{}, dbEnv...), "BENCH_RUNNER=pgfork.django.Runner", "BENCH_EXTRA_KEY="+key+"-zero"), env...)
		res, err := djManage(ctx, py, proj, zenv, "app01")
		return res.setup, err
	})

	med := func(m *mode, f func(djRun) time.Duration) time.Duration {
		var s Sample
		for _, x := range m.runs {
			s = append(s, f(x))
		}
		return s.Median()
	}
	wall := func(x djRun) time.Duration { return x.wall }
	setup := func(x djRun) time.Duration { return x.setup }
	clones := func(x djRun) time.Duration { return x.clones + x.workers }
	testsT := func(x djRun) time.Duration { return x.tests }
	var rows [][]string
	for _, m := range modes {
		rows = append(rows, []string{m.name, strconv.Itoa(m.runs[0].ran), Dur(med(m, wall)), Dur(med(m, setup)), Dur(med(m, clones)), Dur(med(m, testsT))})
	}
	r.Notef("Medians of %d runs per mode (wall: process start to exit). pgfork serve with its own pool sizes (what it said: %s).", reps, srv.sized())
	r.Table([]string{"mode", "tests", "wall", "database setup", "of which worker databases (Django: clones; pgfork: from the pool)", "tests (Ran … in)"}, rows)
	rows = nil
	for _, m := range modes {
		var w []string
		for _, x := range m.runs {
			w = append(w, fmt.Sprintf("%s (setup %s)", Dur(x.wall), Dur(x.setup)))
		}
		rows = append(rows, []string{m.name, strings.Join(w, ", ")})
	}
	r.Notef("Every run, in order (the first pgfork runs build a new template each, on a server that has not yet learnt which CREATE DATABASE strategy is fastest for it).")
	r.Table([]string{"mode", "wall (setup) per run"}, rows)

	pairs := [][3]any{
		{"first run", stockFirst, pgFirst},
		{"second run (--keepdb vs template reused)", stockKeep, pgSecond},
		{"--parallel 4", stockPar, pgPar},
		{"TransactionTestCase part", stockTx, pgTx},
	}
	rows = nil
	for _, p := range pairs {
		a, b := p[1].(*mode), p[2].(*mode)
		rows = append(rows, []string{p[0].(string), Dur(med(a, wall)), Dur(med(b, wall)), Ratio(med(a, wall), med(b, wall)),
			Dur(med(a, setup)), Dur(med(b, setup)), Ratio(med(a, setup), med(b, setup))})
	}
	r.Notef("Side by side (ratio: how many times faster pgfork is).")
	r.Table([]string{"mode", "Django wall", "pgfork wall", "wall ratio", "Django setup", "pgfork setup", "setup ratio"}, rows)

	fresh := func(m *mode) FloorRow {
		return FloorRow{Name: m.name, Suite: med(m, wall), Rate: float64(djTxCases*10) / med(m, testsT).Seconds()}
	}
	r.Notef("Against the floor (issue 33): median wall times; fresh DBs/s: pgfork's %d TransactionTestCase tests (each takes a fresh database) over the tests' time "+
		"(\"Ran … in\"); bare: 4 sessions running CREATE DATABASE … STRATEGY FILE_COPY from the floor's database on the same cluster, 40 databases.", djTxCases*10)
	r.FloorTable("against the floor, one process", bare, FloorRow{Name: floorSerial.name, Suite: med(floorSerial, wall)}, fresh(pgFirst), fresh(pgSecond))
	r.FloorTarget("pgfork.django.Runner's second run (template reused)", med(pgSecond, wall), med(floorSerial, wall), 1.5)
	r.FloorTable("against the floor, --parallel 4", bare, FloorRow{Name: floorPar.name, Suite: med(floorPar, wall)}, fresh(pgPar))
	r.FloorTarget("pgfork.django.Runner --parallel 4 (template reused, a second run)", med(pgPar, wall), med(floorPar, wall), 1.5)
	r.ZeroSetupTarget("Django (manage.py test app01)", zFirst, zSecond, 0, zLeft, zNot)

	second := med(pgSecond, setup)
	r.Target(second <= time.Second, "a second run's database setup ≤ 1 s: pgfork %s (Django's first run migrates for %s; --keepdb %s).",
		Dur(second), Dur(med(stockFirst, setup)), Dur(med(stockKeep, setup)))
	parPg, parClones, parAll := med(pgPar, clones), med(stockPar, clones), med(pgPar, setup)
	r.Target(parPg*10 <= parClones, "--parallel 4 setup ≥ 10x faster than Django's clones: pgfork's 4 worker databases from the pool %s vs Django's 4 clones %s (%s); "+
		"pgfork's whole setup (template key, main database, workers) %s (%s).",
		Dur(parPg), Dur(parClones), Ratio(parClones, parPg), Dur(parAll), Ratio(parClones, parAll))
	txPg, txStock := med(pgTx, testsT), med(stockTx, testsT)
	r.Target(txPg*3 <= txStock, "TransactionTestCase part ≥ 3x faster than flush: %s vs %s (%s).", Dur(txPg), Dur(txStock), Ratio(txStock, txPg))
	slower := []string{}
	for _, p := range pairs {
		a, b := p[1].(*mode), p[2].(*mode)
		if med(b, wall) > med(a, wall) {
			slower = append(slower, p[0].(string))
		}
	}
	r.Target(len(slower) == 0, "the whole suite never slower than stock in any mode (by median wall time)%s.", map[bool]string{true: "", false: ": slower in " + strings.Join(slower, ", ")}[len(slower) == 0])
	if os.Getenv("PGFORK_BENCH_DJANGO_PYTEST") == "0" {
		r.Notef("pytest-django part not measured (PGFORK_BENCH_DJANGO_PYTEST=0).")
		return nil
	}
	return djPytestBench(ctx, r, py, proj, reps, stock, pgforkEnv, key)
}

// djPytestBench: the same suite under pytest-django, stock and with the plugin.
func djPytestBench(ctx context.Context, r *Report, py, proj string, reps int, stock []string, pgforkEnv func(string) []string, key string) error {
	plugin := []string{"-p", "pgfork.django.pytest_plugin"}
	type pmode struct {
		name    string
		env     func(i int) []string
		args    []string
		prime   bool
		samples Sample
	}
	same := func(e []string) func(int) []string { return func(int) []string { return e } }
	pkey := key + "-pytest"
	modes := []*pmode{
		{name: "pytest-django --create-db", env: same(stock), args: []string{"--create-db"}},
		{name: "pytest-django --reuse-db (second run)", env: same(stock), args: []string{"--reuse-db"}, prime: true},
		{name: "pytest-django -n 4", env: same(stock), args: []string{"-n", "4"}},
		{name: "plugin --create-db (template rebuilt)", env: same(pgforkEnv(pkey)), args: append([]string{"--create-db"}, plugin...)},
		{name: "plugin --reuse-db (second run)", env: same(pgforkEnv(pkey)), args: append([]string{"--reuse-db"}, plugin...), prime: true},
		{name: "plugin -n 4", env: same(pgforkEnv(pkey)), args: append([]string{"-n", "4"}, plugin...)},
	}
	for _, m := range modes {
		if m.prime {
			if _, err := djPytest(ctx, py, proj, m.env(0), m.args...); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
		}
		for i := 0; i < reps; i++ {
			took, err := djPytest(ctx, py, proj, m.env(i), m.args...)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			m.samples = append(m.samples, took)
		}
	}
	r.Notef("pytest-django (the same tests as unittest classes, `pytest -q --ds benchproject.settings -o python_files=tests.py`), median wall of %d runs; "+
		"stock -n 4 creates and migrates one database per worker, the plugin takes them from the pool.", reps)
	var rows [][]string
	slower := []string{}
	for i := 0; i < 3; i++ {
		a, b := modes[i], modes[i+3]
		rows = append(rows, []string{a.name, Dur(a.samples.Median()), b.name, Dur(b.samples.Median()), Ratio(a.samples.Median(), b.samples.Median())})
		if b.samples.Median() > a.samples.Median() {
			slower = append(slower, a.name)
		}
	}
	r.Table([]string{"stock", "wall", "pgfork", "wall", "ratio"}, rows)
	r.Target(len(slower) == 0, "pytest-django: never slower than stock in any mode%s.", map[bool]string{true: "", false: ": slower in " + strings.Join(slower, ", ")}[len(slower) == 0])
	return nil
}
