package upgrade_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/upgrade"
)

// runServing runs an upgrade as the user pgfork's tests run PostgreSQL as,
// logs its messages and checks that pg_upgrade's steps were reported; a
// new cluster it handed over is left running.
func runServing(t *testing.T, o upgrade.Options) (*upgrade.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o.User = pgtest.User(t)
	var steps []string
	prev := o.OnEvent
	o.OnEvent = func(e upgrade.Event) {
		if prev != nil {
			prev(e)
		}
		if e.Message != "" {
			t.Logf("%s: %s", e.Phase, e.Message)
		}
		if e.Step != "" && e.Done {
			steps = append(steps, e.Step)
		}
	}
	res, err := upgrade.Run(ctx, o)
	if err == nil && len(steps) == 0 {
		t.Error("no pg_upgrade steps were reported as progress")
	}
	return res, err
}

// runUpgrade runs an upgrade as runServing does and, where it handed the
// new cluster over (left it running for the application), stops it as its
// user would before looking at its files.
func runUpgrade(t *testing.T, o upgrade.Options) (*upgrade.Result, error) {
	t.Helper()
	res, err := runServing(t, o)
	if err == nil && res.Running {
		inst, aerr := instance.Attach(o.NewDir)
		if aerr != nil {
			t.Fatalf("the run says it left the new cluster running, but: %v", aerr)
		}
		if serr := inst.Stop(context.Background(), instance.Fast); serr != nil {
			t.Fatalf("stop the handed-over new cluster: %v", serr)
		}
	}
	return res, err
}

// upgradeAndVerify upgrades a copy of the fixture in dir with mode and
// checks the new cluster's contents, the mode used, and the old cluster.
func upgradeAndVerify(t *testing.T, b builds, dir string, mode, want upgrade.Mode, rh upgrade.Rehearse) *upgrade.Result {
	t.Helper()
	_, sums := fixture(t, b)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new,
		Mode: mode, Rehearse: rh, Confirmed: true, Jobs: 2})
	if err != nil {
		t.Fatalf("upgrade: %v (hint: %s)", err, errs.HintOf(err))
	}
	if res.Mode != want {
		t.Errorf("mode %s, want %s (%s)", res.Mode, want, res.ModeReason)
	}
	if res.Control.ChecksumsEnabled() {
		t.Error("the fixture has data checksums off; the test needs it so to cover PostgreSQL 18's default")
	}
	got := startAndSum(t, b.new, newDir)
	compareSums(t, sums, got)
	if want != upgrade.Link && want != upgrade.Swap {
		// The old cluster is still startable and unchanged in content.
		compareSums(t, sums, startAndSum(t, b.old, old))
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(newDir), ".new.pgfork-upgrade")); !os.IsNotExist(err) {
		t.Errorf("the workspace was left behind: %v", err)
	}
	if res.Bytes == 0 || res.SharedBytes+res.CopiedBytes == 0 {
		t.Errorf("no bytes reported: %+v", res)
	}
	t.Logf("%s: %s, shared %d, copied %d, phases %+v", want, res.Elapsed, res.SharedBytes, res.CopiedBytes, res.Phases)
	return res
}

func TestUpgradeCloneOnXFSWithRehearsal(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.XFSDir(t)
	_, sums := fixture(t, b)
	old := copyFixture(t, b, dir)

	// A rehearsal alone leaves the original byte for byte as it was.
	roots := tablespaceRoots(t, old)
	before := treeSums(t, roots...)
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: filepath.Join(dir, "new"), Old: b.old, New: b.new, Rehearse: upgrade.RehearseOnly})
	if err != nil {
		t.Fatalf("rehearsal: %v (hint: %s)", err, errs.HintOf(err))
	}
	if res.Rehearsal == nil || !res.Rehearsal.OriginalUnchanged || res.Rehearsal.Mode != upgrade.Clone || !res.RehearsalOnly {
		t.Fatalf("rehearsal result: %+v", res.Rehearsal)
	}
	if d := diffSums(before, treeSums(t, roots...)); len(d) > 0 {
		t.Fatalf("the rehearsal changed the original: %v", d)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !os.IsNotExist(err) {
		t.Fatalf("a rehearsal created the new data directory: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*pgfork*")); len(left) > 0 {
		t.Fatalf("the rehearsal left %v", left)
	}
	compareSums(t, sums, startAndSum(t, b.old, old))

	// auto on XFS: rehearsal by default, then clone.
	res, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: filepath.Join(dir, "new"), Old: b.old, New: b.new})
	if err != nil {
		t.Fatalf("upgrade: %v (hint: %s)", err, errs.HintOf(err))
	}
	if res.Mode != upgrade.Clone || res.Rehearsal == nil {
		t.Fatalf("auto on XFS: mode %s, rehearsal %v", res.Mode, res.Rehearsal)
	}
	if res.SharedBytes == 0 {
		t.Errorf("clone mode shared no bytes: %+v", res)
	}
	compareSums(t, sums, startAndSum(t, b.new, filepath.Join(dir, "new")))
	compareSums(t, sums, startAndSum(t, b.old, old))
}

func TestUpgradeCopyFileRangeOnExt4(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	if b.new.Major < 17 {
		t.Skip("copy-file-range needs pg_upgrade 17+")
	}
	dir := testenv.Dir(t)
	res := upgradeAndVerify(t, b, dir, upgrade.Auto, upgrade.CopyFileRange, upgrade.RehearseAuto)
	if res.Rehearsal != nil {
		t.Error("auto rehearsed on a filesystem that cannot clone")
	}
}

func TestUpgradeCopy(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	upgradeAndVerify(t, b, testenv.Dir(t), upgrade.Copy, upgrade.Copy, upgrade.RehearseOff)
}

func TestUpgradeLink(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.Dir(t)
	old := copyFixture(t, b, dir)
	// Not confirmed: refused before anything is done.
	_, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: filepath.Join(dir, "new"), Old: b.old, New: b.new, Mode: upgrade.Link})
	if errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), "can no longer be started") {
		t.Fatalf("link without confirmation: %v", err)
	}
	if err := os.RemoveAll(old); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(old + ".tblspc")
	res := upgradeAndVerify(t, b, dir, upgrade.Link, upgrade.Link, upgrade.RehearseOff)
	if res.SharedBytes == 0 {
		t.Errorf("link mode shared no bytes: %+v", res)
	}
}

func TestUpgradeRefuses(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.Dir(t)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	opts := func() upgrade.Options {
		return upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOff}
	}
	before := treeSums(t, tablespaceRoots(t, old)...)

	// Not a newer major.
	o := opts()
	o.New = b.old
	if _, err := runUpgrade(t, o); errs.KindOf(err) != errs.Unsupported {
		t.Errorf("same major: %v", err)
	}
	// NEW_DATADIR exists.
	if err := os.Mkdir(newDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := runUpgrade(t, opts()); errs.KindOf(err) != errs.Exists {
		t.Errorf("existing new dir: %v", err)
	}
	_ = os.Remove(newDir)
	// Clone where the filesystem cannot.
	o = opts()
	o.Mode = upgrade.Clone
	if _, err := runUpgrade(t, o); errs.KindOf(err) != errs.Unsupported {
		t.Errorf("clone on ext4: %v", err)
	}
	if d := diffSums(before, treeSums(t, tablespaceRoots(t, old)...)); len(d) > 0 {
		t.Fatalf("a refused upgrade changed the old cluster: %v", d)
	}

	// The old cluster runs: refused, then --stop-old stops it cleanly and
	// the check passes.
	ctx := context.Background()
	inst, err := instance.Start(ctx, instance.Config{BinDir: b.old.BinDir, Env: b.old.Env, DataDir: old, User: pgtest.User(t),
		LogFile: filepath.Join(t.TempDir(), "old.log")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = inst.Stop(ctx, instance.Fast) }()
	_, err = runUpgrade(t, opts())
	if errs.KindOf(err) != errs.Busy || !strings.Contains(errs.CLIHintOf(err), "--stop-old") || !strings.Contains(errs.HintOf(err), "online clone") {
		t.Fatalf("running old cluster: %v (hint %q)", err, errs.HintOf(err))
	}
	o = opts()
	o.StopOld, o.CheckOnly = true, true
	res, err := runUpgrade(t, o)
	if err != nil {
		t.Fatalf("--stop-old --check: %v (hint: %s)", err, errs.HintOf(err))
	}
	if !res.CheckOnly {
		t.Error("CheckOnly not reported")
	}
	if _, err := os.Stat(newDir); !os.IsNotExist(err) {
		t.Errorf("--check left the new data directory: %v", err)
	}
}

// TestFindingsInPlainWords leaves a prepared transaction in the old
// cluster, which pg_upgrade refuses: a rehearsal must fail with the problem
// in plain words, keep pg_upgrade's logs, and leave the original as it was;
// --check must say the same.
func TestFindingsInPlainWords(t *testing.T) {
	t.Parallel() // see TestMain
	b := findBuilds(t)
	dir := testenv.Dir(t)
	old := copyFixture(t, b, dir)
	ctx := context.Background()
	cfg := instance.Config{BinDir: b.old.BinDir, Env: b.old.Env, DataDir: old, User: pgtest.User(t), LogFile: filepath.Join(t.TempDir(), "old.log"),
		Settings: map[string]string{"max_prepared_transactions": "5"}}
	inst, err := instance.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, inst.ConnString("", "shop"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"ALTER SYSTEM SET max_prepared_transactions = 5", "BEGIN", "INSERT INTO items(name) VALUES ('pending')", "PREPARE TRANSACTION 'pending'"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	conn.Close(ctx)
	if err := inst.Stop(ctx, instance.Fast); err != nil {
		t.Fatal(err)
	}
	newDir := filepath.Join(dir, "new")
	before := treeSums(t, tablespaceRoots(t, old)...)
	check := func(err error, what string) {
		t.Helper()
		if errs.KindOf(err) != errs.Unsupported || !strings.Contains(err.Error(), "prepared transactions that were never committed") ||
			!strings.Contains(errs.HintOf(err), "logs are kept in") {
			t.Fatalf("%s: %v (hint: %s)", what, err, errs.HintOf(err))
		}
		logs, _ := filepath.Glob(newDir + ".pgfork-*logs-*")
		if len(logs) == 0 {
			t.Errorf("%s: pg_upgrade's logs were not kept", what)
		}
		for _, l := range logs {
			_ = os.RemoveAll(l)
		}
		if _, err := os.Stat(newDir); !os.IsNotExist(err) {
			t.Errorf("%s: NEW_DATADIR exists after a failure: %v", what, err)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, ".*pgfork*")); len(left) > 0 {
			t.Errorf("%s: left %v", what, left)
		}
	}
	_, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, Rehearse: upgrade.RehearseOnly})
	check(err, "rehearsal")
	if !strings.Contains(err.Error(), "old cluster was not touched") {
		t.Errorf("rehearsal error does not say the original is safe: %v", err)
	}
	if d := diffSums(before, treeSums(t, tablespaceRoots(t, old)...)); len(d) > 0 {
		t.Fatalf("a failed rehearsal changed the original: %v", d)
	}
	_, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new, CheckOnly: true})
	check(err, "check")
}
