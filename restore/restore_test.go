package restore

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbackup"
)

// TestRestoreChainMatchesCombineBackup rebuilds a full + 3 incrementals
// chain and checks the result against pg_combinebackup's, file by file
// and manifest entry by manifest entry, then verifies and starts it.
func TestRestoreChainMatchesCombineBackup(t *testing.T) {
	forEachPGOnFS(t, func(t *testing.T, e pgEnv, base string) {
		c := e.makeChain(t, base)
		before := map[string]map[string]string{}
		for _, d := range c.dirs {
			before[d] = testenv.TreeHash(t, d)
		}
		ref := filepath.Join(base, "combined")
		e.Tool(t, "pg_combinebackup", append([]string{"-o", ref, "--no-sync"}, c.dirs...)...)
		out := filepath.Join(base, "restored")
		dry, err := PlanOnly(c.dirs, out, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(out); !os.IsNotExist(err) || len(leftovers(out)) > 0 {
			t.Fatalf("a dry run wrote something: %v, %v", err, leftovers(out))
		}
		// Beside the backups on XFS the result shares their blocks.
		onXFS := os.Getenv("PGFORK_TEST_XFS") != "" && strings.Contains(base, os.Getenv("PGFORK_TEST_XFS"))
		if dry.SharesBlocks != onXFS || onXFS != (dry.NeedBytes == 0) {
			t.Errorf("dry run in %s: shares blocks %v, needs %d bytes; want sharing %v", base, dry.SharesBlocks, dry.NeedBytes, onXFS)
		}
		sum, err := Restore(context.Background(), c.dirs, out, Options{Sync: clone.SyncNone, Owner: e.owner()})
		if err != nil {
			t.Fatal(err)
		}
		// The plan a dry run prints is the restore's: the same counts.
		d := dry.Summary
		if d.Files != sum.Files || d.FilesWhole != sum.FilesWhole || d.FilesOlder != sum.FilesOlder || d.FilesRebuilt != sum.FilesRebuilt ||
			fmt.Sprint(d.BlocksBySource) != fmt.Sprint(sum.BlocksBySource) || d.ZeroBlocks != sum.ZeroBlocks || d.Calls < sum.Calls {
			t.Errorf("dry run planned %+v\nrestore did %+v", d, *sum)
		}
		if d.Bytes != sum.Bytes {
			t.Errorf("dry run planned %d bytes of files, restore wrote %d", d.Bytes, sum.Bytes)
		}
		t.Logf("%d files: %d whole (%d from older backups), %d rebuilt, blocks by backup %v, zero %d, %d calls; shared %d, range %d, copied %d",
			sum.Files, sum.FilesWhole, sum.FilesOlder, sum.FilesRebuilt, sum.BlocksBySource, sum.ZeroBlocks, sum.Calls,
			sum.SharedBytes, sum.RangeBytes, sum.CopiedBytes)
		if sum.FilesRebuilt == 0 || sum.FilesOlder == 0 {
			t.Errorf("the chain exercised too little: %d files rebuilt, %d unchanged since an older backup", sum.FilesRebuilt, sum.FilesOlder)
		}
		for i, n := range sum.BlocksBySource {
			if n == 0 {
				t.Errorf("no rebuilt block came from backup %d: the chain does not exercise all sources", i)
			}
		}
		if strings.Contains(base, os.Getenv("PGFORK_TEST_XFS")) && os.Getenv("PGFORK_TEST_XFS") != "" && sum.SharedBytes < sum.Bytes/2 {
			t.Errorf("on XFS only %d of %d bytes were shared with the backups", sum.SharedBytes, sum.Bytes)
		}
		sameFiles(t, ref, out)
		sameManifest(t, ref, out)
		e.Tool(t, "pg_verifybackup", out)

		for _, d := range c.dirs {
			testenv.SameTree(t, "backup "+filepath.Base(d), before[d], testenv.TreeHash(t, d))
		}

		in, err := instance.Start(context.Background(), instance.Config{BinDir: e.Bin, Env: e.Inst.Env(), DataDir: out, User: e.User,
			Profile: instance.Durable, Settings: map[string]string{"fsync": "off"}, LogFile: out + ".server.log"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = in.Stop(context.Background(), instance.Immediate) })
		url := in.ConnString("", "")
		pgtest.CheckPgbenchInvariant(t, url, "the chain did not capture the pgbench runs")
		for q, want := range map[string]string{
			"SELECT count(*)::text FROM grow":                                c.growRows,
			"SELECT count(*)::text FROM truncme":                             c.truncRows,
			"SELECT (to_regclass('dropme') IS NULL)::text":                   "true",
			"SELECT count(*)::text FROM pgbench_accounts":                    "200000",
			"SELECT count(*)::text FROM pg_database WHERE datname = 'newdb'": "1",
		} {
			if got := pgtest.Query(t, url, q); got != want {
				t.Errorf("%s = %s, want %s", q, got, want)
			}
		}
		if got := pgtest.Query(t, in.ConnString("", "newdb"), "SELECT count(*)::text FROM t"); got != c.newdbRows {
			t.Errorf("newdb.t has %s rows, want %s", got, c.newdbRows)
		}
		pgtest.Stop(t, in)
		e.toolAs(t, "pg_checksums", "--check", "-D", out)

		// pg_combinebackup's manifest options, on the same chain: once,
		// with the newest major on ext4 (what they change is the
		// manifest's checksums, the same on any filesystem; each is a
		// combine, a restore and a verify more).
		algos := []string{"SHA224", "sha512", "NONE"}
		if e.Inst.Major != newestPG(t).Inst.Major || !strings.HasSuffix(t.Name(), "/ext4") {
			algos = nil
		}
		for _, algo := range algos {
			ref := filepath.Join(base, "combined-"+algo)
			e.Tool(t, "pg_combinebackup", append([]string{"-o", ref, "--no-sync", "--manifest-checksums", strings.ToUpper(algo)}, c.dirs...)...)
			out := filepath.Join(base, "restored-"+algo)
			sum, err := Restore(context.Background(), c.dirs, out, Options{Sync: clone.SyncNone, Owner: e.owner(), Checksums: algo})
			if err != nil {
				t.Fatalf("%s: %v", algo, err)
			}
			if sum.Checksums != strings.ToUpper(algo) {
				t.Errorf("summary says %s checksums, want %s", sum.Checksums, strings.ToUpper(algo))
			}
			sameManifest(t, ref, out)
			e.Tool(t, "pg_verifybackup", "--no-parse-wal", out)
		}
		ref = filepath.Join(base, "combined-no-manifest")
		e.Tool(t, "pg_combinebackup", append([]string{"-o", ref, "--no-sync", "--no-manifest"}, c.dirs...)...)
		out = filepath.Join(base, "restored-no-manifest")
		if _, err := Restore(context.Background(), c.dirs, out, Options{Sync: clone.SyncNone, Owner: e.owner(), NoManifest: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(out, "backup_manifest")); !os.IsNotExist(err) {
			t.Errorf("--no-manifest wrote a backup_manifest (%v)", err)
		}
		sameFiles(t, ref, out)
		// --link: files whole in a backup are that backup's own files.
		out = filepath.Join(base, "restored-link")
		sum, err = Restore(context.Background(), c.dirs, out, Options{Sync: clone.SyncNone, Link: true}) // the backups are root's: so is the result
		if err != nil {
			t.Fatal(err)
		}
		if sum.LinkedBytes == 0 || sum.LinkedBytes+sum.SharedBytes+sum.RangeBytes+sum.CopiedBytes != sum.Bytes {
			t.Errorf("linked %d of %d bytes (shared %d, range %d, copied %d)", sum.LinkedBytes, sum.Bytes, sum.SharedBytes, sum.RangeBytes, sum.CopiedBytes)
		}
		a, err1 := os.Stat(filepath.Join(out, "PG_VERSION"))
		b, err2 := os.Stat(filepath.Join(c.dirs[len(c.dirs)-1], "PG_VERSION"))
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			t.Errorf("PG_VERSION is not a link to the newest backup's (%v, %v)", err1, err2)
		}
		sameFiles(t, filepath.Join(base, "combined"), out)
		e.Tool(t, "pg_verifybackup", "--no-parse-wal", out)
		if o := e.owner(); o != nil { // root restoring for another user: links would give the backups' files away
			_, err := Restore(context.Background(), c.dirs, filepath.Join(base, "linked-owner"), Options{Owner: o, Link: true})
			if errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), "not to the result's owner") {
				t.Errorf("--link for another owner: %v, want a usage error", err)
			}
			if _, err := os.Lstat(filepath.Join(base, "linked-owner")); !os.IsNotExist(err) || len(leftovers(filepath.Join(base, "linked-owner"))) > 0 {
				t.Errorf("a refused --link left something behind: %v %v", err, leftovers(filepath.Join(base, "linked-owner")))
			}
		}
		if _, err := Run(context.Background(), RunOptions{Backups: c.dirs, Dst: filepath.Join(base, "linked-start"), Start: true,
			Restore: Options{Link: true}}); errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), "starting it would change the backups") {
			t.Errorf("--link --start: %v, want a usage error", err)
		}
		if e.Inst.Major >= 18 {
			ref := filepath.Join(base, "combined-link")
			e.Tool(t, "pg_combinebackup", append([]string{"-o", ref, "--no-sync", "--link"}, c.dirs...)...)
			sameFiles(t, ref, out)
			sameManifest(t, ref, out)
		}
		if _, err := Restore(context.Background(), c.dirs, filepath.Join(base, "bad"), Options{Checksums: "MD5"}); errs.KindOf(err) != errs.Usage ||
			!strings.Contains(err.Error(), `unknown manifest checksum algorithm "MD5"`) {
			t.Errorf("MD5: %v, want a usage error naming it", err)
		}
	})
}

// sameFiles checks that every file of pg_combinebackup's output (but the
// manifest, whose mtimes differ) has the same bytes in ours, and that no
// file is missing or extra.
func sameFiles(t *testing.T, ref, out string) { sameFilesAtLeast(t, ref, out, 100) }

// sameFilesAtLeast is sameFiles for a tree of at least min files.
func sameFilesAtLeast(t *testing.T, ref, out string, min int) {
	t.Helper()
	list := func(root string) map[string]bool {
		m := map[string]bool{}
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				rel, _ := filepath.Rel(root, p)
				if rel != "backup_manifest" {
					m[rel] = true
				}
			}
			return nil
		})
		return m
	}
	a, b := list(ref), list(out)
	for rel := range a {
		if !b[rel] {
			t.Errorf("%s is in pg_combinebackup's output but not in ours", rel)
			continue
		}
		x, err1 := os.ReadFile(filepath.Join(ref, rel))
		y, err2 := os.ReadFile(filepath.Join(out, rel))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs from pg_combinebackup's (%d vs %d bytes)", rel, len(y), len(x))
		}
	}
	for rel := range b {
		if !a[rel] {
			t.Errorf("%s is in our output but not in pg_combinebackup's", rel)
		}
	}
	if len(a) < min {
		t.Errorf("only %d files compared", len(a))
	}
}

// sameManifest checks that both manifests list the same files with the
// same sizes and checksums, and the same WAL ranges.
func sameManifest(t *testing.T, ref, out string) {
	t.Helper()
	a, err := pgbackup.ReadManifest(filepath.Join(ref, "backup_manifest"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgbackup.ReadManifest(filepath.Join(out, "backup_manifest"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Version != b.Version || a.SystemID != b.SystemID {
		t.Errorf("manifest version/system %d/%d, pg_combinebackup's %d/%d", b.Version, b.SystemID, a.Version, a.SystemID)
	}
	for p, fa := range a.Files {
		fb := b.Files[p]
		if fb == nil {
			t.Errorf("manifest lacks %s", p)
			continue
		}
		if fa.Size != fb.Size || fa.Algorithm != fb.Algorithm || !bytes.Equal(fa.Checksum, fb.Checksum) {
			t.Errorf("manifest entry %s: %d %s %x, pg_combinebackup's %d %s %x", p, fb.Size, fb.Algorithm, fb.Checksum, fa.Size, fa.Algorithm, fa.Checksum)
		}
	}
	if len(a.Files) != len(b.Files) {
		t.Errorf("manifest has %d files, pg_combinebackup's %d", len(b.Files), len(a.Files))
	}
	if len(a.WAL) != len(b.WAL) || (len(a.WAL) > 0 && a.WAL[0] != b.WAL[0]) {
		t.Errorf("WAL ranges %v, pg_combinebackup's %v", b.WAL, a.WAL)
	}
}
