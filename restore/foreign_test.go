package restore

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestRestoreRefusesForeignLinks (issue 57, rule 4, G11): a backup of user
// nobody whose pg_tblspc link points to a root-only directory (holding the
// tablespace's files and a secret) is refused when root restores it for
// nobody, and nothing of the directory reaches the result; the same backup
// restored for the run-as user is refused as nobody's. Before, a
// root-owned tablespace directory was accepted in anyone's backup: root
// copied it into a tree nobody got.
func TestRestoreRefusesForeignLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on root restoring another user's backup")
	}
	e := newestPG(t)
	// A short path: pg_basebackup's tar format holds a tablespace link's
	// target in 100 bytes, and testenv.Dir's path under the run's TMPDIR is
	// longer in make check (TestRestoreTablespaces uses the same).
	base := testenv.XFSDir(t)
	tsSrc := filepath.Join(base, "ts-src")
	if err := e.User.MkdirOwned(tsSrc, 0o700); err != nil {
		t.Fatal(err)
	}
	_, in := e.newCluster(t, base, "src", nil)
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLESPACE ts LOCATION '"+tsSrc+"'", "CREATE TABLE x(i int) TABLESPACE ts")
	b0, ts0 := filepath.Join(base, "b0"), filepath.Join(base, "b0-ts")
	e.basebackup(t, in, b0, "", "-T", tsSrc+"="+ts0)
	pgtest.Stop(t, in)

	// nobody's backup; its link now leads to a root-only copy of the
	// tablespace with a secret beside.
	rootOnly := filepath.Join(base, "root-only")
	if out, err := exec.Command("cp", "-a", ts0, rootOnly).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	const secret = "root's secret"
	if err := os.WriteFile(filepath.Join(rootOnly, "secret"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chown", "-R", "0:0", rootOnly).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}
	if err := os.Chmod(rootOnly, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chown", "-R", "65534:65534", b0).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}
	links, _ := filepath.Glob(filepath.Join(b0, "pg_tblspc", "*"))
	if len(links) != 1 {
		t.Fatalf("the backup's tablespace links: %v", links)
	}
	if err := os.Remove(links[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rootOnly, links[0]); err != nil {
		t.Fatal(err)
	}

	out, outTS := filepath.Join(base, "out"), filepath.Join(base, "out-ts")
	nobody := &clone.Owner{UID: pgtest.Nobody.UID, GID: pgtest.Nobody.GID}
	_, err := Restore(context.Background(), []string{b0}, out, Options{Owner: nobody, Tablespaces: map[string]string{rootOnly: outTS}})
	if errs.KindOf(err) != errs.Permission || !strings.Contains(err.Error(), "pg_tblspc/") {
		t.Errorf("nobody's backup linking to a root-only directory: %v, want a refusal naming the link", err)
	}
	_, err = Restore(context.Background(), []string{b0}, out+"2", Options{Owner: e.owner(), Tablespaces: map[string]string{rootOnly: outTS + "2"}})
	if errs.KindOf(err) != errs.Permission || !strings.Contains(err.Error(), "nobody") {
		t.Errorf("nobody's backup restored for %s: %v, want a refusal naming nobody", e.User.Name, err)
	}
	for _, p := range []string{out, outTS, out + "2", outTS + "2"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("a refused restore left %s", p)
		}
		_ = filepath.WalkDir(p, func(f string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, _ := os.ReadFile(f); strings.Contains(string(b), secret) {
					t.Errorf("root's secret was copied to %s", f)
				}
			}
			return nil
		})
	}
}
