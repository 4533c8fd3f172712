package upgrade_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/upgrade"
)

// userFile returns a user relation's main-fork file (a relfilenode of
// 16384 or more, not empty) in the old cluster's tablespace ts1.
func userFile(t *testing.T, old string) string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(old, "pg_tblspc"))
	if err != nil || len(ents) != 1 {
		t.Fatalf("the fixture's copy should have one tablespace: %v %v", ents, err)
	}
	files, _ := filepath.Glob(filepath.Join(old, "pg_tblspc", ents[0].Name(), "PG_*", "*", "*"))
	digits := regexp.MustCompile(`^[0-9]+$`)
	for _, f := range files {
		n, _ := strconv.Atoi(filepath.Base(f))
		if fi, err := os.Stat(f); err == nil && fi.Size() > 0 && digits.MatchString(filepath.Base(f)) && n >= 16384 {
			return f
		}
	}
	t.Fatalf("no user relation file in the old cluster's tablespace: %v", files)
	return ""
}

// TestNoRehearseComparesFilesOnDisk: without a rehearsal, the old
// cluster's catalogs are read through template1 alone (no connection per
// database), and the smoke check after the upgrade compares each user
// relation's file with the old cluster's under the same relfilenode
// (PostgreSQL 15+), in tablespaces too. A relation whose old file is gone
// fails the check, which counting relations did not notice.
func TestNoRehearseComparesFilesOnDisk(t *testing.T) {
	b := findBuilds(t)
	if b.old.Major < 15 {
		t.Skip("pg_upgrade keeps relfilenodes from PostgreSQL 15 on")
	}
	_, sums := fixture(t, b)

	dir := testenv.Dir(t)
	old := copyFixture(t, b, dir)
	newDir := filepath.Join(dir, "new")
	res, err := runUpgrade(t, upgrade.Options{OldDir: old, NewDir: newDir, Old: b.old, New: b.new,
		Mode: upgrade.Copy, Rehearse: upgrade.RehearseOff, NoAnalyze: true, Confirmed: true, Jobs: 2})
	if err != nil {
		t.Fatalf("upgrade: %v (hint: %s)", err, errs.HintOf(err))
	}
	if res.Catalog == nil || res.Catalog.Relations != nil {
		t.Fatalf("relations were counted through the old server without a rehearsal: %+v", res.Catalog)
	}
	if res.Catalog.Databases["shop"] == 0 || res.Catalog.Databases["crm"] == 0 || res.Catalog.Major != b.old.Major {
		t.Fatalf("the old cluster's databases and major were not read: %+v", res.Catalog)
	}
	compareSums(t, sums, startAndSum(t, b.new, newDir))

	// The same upgrade, but a user relation's file vanishes from the old
	// cluster after pg_upgrade copied it (--mode copy: the copies are
	// independent): the new cluster's relation has no counterpart.
	dir = testenv.Dir(t)
	old = copyFixture(t, b, dir)
	victim := userFile(t, old)
	defer upgrade.SetTestHook(func(step string) {
		if step != "transferred" {
			return
		}
		if err := os.Rename(victim, victim+".moved"); err != nil {
			t.Error(err)
		}
	})()
	_, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: filepath.Join(dir, "new"), Old: b.old, New: b.new,
		Mode: upgrade.Copy, Rehearse: upgrade.RehearseOff, NoAnalyze: true, Confirmed: true, Jobs: 2})
	if err == nil || !strings.Contains(err.Error(), "smoke check") || !strings.Contains(err.Error(), "no counterpart "+victim) {
		t.Fatalf("a relation without its old file passed the smoke check: %v", err)
	}
}

// TestSmokeCheckConnectsWhereThereAreFiles: without tablespaces, the smoke
// check connects only to the databases with user relation files (an empty
// database is checked by its name and OID: with a thousand of them the
// connections were most of pgfork's own time), and still finds a relation
// of a database it connects to whose old file is gone.
func TestSmokeCheckConnectsWhereThereAreFiles(t *testing.T) {
	b := findBuilds(t)
	if b.old.Major < 15 {
		t.Skip("pg_upgrade keeps relfilenodes from PostgreSQL 15 on")
	}
	dir := testenv.Dir(t)
	old := copyFixture(t, b, dir)
	inst, conn := startOld(t, b, old, nil)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "ALTER TABLE archive SET TABLESPACE pg_default"); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, inst.ConnString("", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"DROP TABLESPACE ts1", "CREATE DATABASE e0", "CREATE DATABASE e1", "CREATE DATABASE e2"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	admin.Close(ctx)
	conn.Close(ctx)
	if err := inst.Stop(ctx, instance.Fast); err != nil {
		t.Fatal(err)
	}
	victim := ""
	files, _ := filepath.Glob(filepath.Join(old, "base", "*", "*"))
	for _, f := range files {
		if n, err := strconv.Atoi(filepath.Base(f)); err == nil && n >= 16384 {
			victim = f
			break
		}
	}
	if victim == "" {
		t.Fatal("no user relation file in base/")
	}
	defer upgrade.SetTestHook(func(step string) {
		if step == "transferred" {
			if err := os.Rename(victim, victim+".moved"); err != nil {
				t.Error(err)
			}
		}
	})()
	var said string
	_, err = runUpgrade(t, upgrade.Options{OldDir: old, NewDir: filepath.Join(dir, "new"), Old: b.old, New: b.new,
		Mode: upgrade.Copy, Rehearse: upgrade.RehearseOff, NoAnalyze: true, Confirmed: true, Jobs: 2,
		OnEvent: func(e upgrade.Event) {
			if strings.HasPrefix(e.Message, "smoke check:") {
				said = e.Message
			}
		}})
	if err == nil || !strings.Contains(err.Error(), "no counterpart "+victim) {
		t.Fatalf("a relation without its old file passed the smoke check: %v", err)
	}
	// template1 and e0..e2 have no user relation files; postgres, shop
	// and crm have tables.
	m := regexp.MustCompile(`^smoke check: (\d+) databases without user relation files .*; (\d+) checked through a connection$`).FindStringSubmatch(said)
	if m == nil || m[1] != "4" || m[2] != "3" {
		t.Fatalf("the smoke check said %q, want 4 databases by name and OID (template1, e0, e1, e2) and 3 through a connection", said)
	}
}
