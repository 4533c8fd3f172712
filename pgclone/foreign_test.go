package pgclone_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgclone"
)

// TestForeignClusterNeverRunsItsCode (issue 57, rule 4: G4, G11, G12): user
// nobody makes a stopped cluster that asks for a preload library of its
// own (a constructor that writes a marker file: no magic block needed),
// sets archive_cleanup_command, recovery_end_command, restore_command,
// archive_command and ssl_passphrase_command to commands writing markers
// (in postgresql.conf, a conf.d file and postgresql.auto.conf, as ALTER
// SYSTEM on a primary puts them into a standby), and links a tablespace to
// a root-only directory. Root then does what `pgfork clone SRC DST`,
// `clone --start` and `branch create --source cluster:SRC` do (pgclone.Clone,
// then cluster.StartBranch):
//
//   - as the run-as user postgres: refused, the data belongs to nobody
//     (before: cloned and started as postgres, the library loaded as
//     postgres);
//   - as nobody: the tablespace link to a root-only directory is refused
//     and nothing of it is copied (before: the root-only file became
//     nobody's);
//   - without that link, as nobody: the clone starts both through
//     cluster.StartBranch and by a plain start of the files as `pgfork
//     clone` leaves them (the printed pg_ctl command), and neither loads
//     the library nor has any of the commands set.
func TestForeignClusterNeverRunsItsCode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on root copying another user's cluster")
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("needs cc to build the hostile library")
	}
	b := pgtest.Builds(t, 0)[0]
	ctx := context.Background()
	base := testenv.Dir(t)
	nobody := &instance.OSUser{Name: "nobody", UID: 65534, GID: 65534}

	// Where the hostile code leaves its marks: writable by everyone.
	marks := filepath.Join(base, "marks")
	if err := os.Mkdir(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(marks, 0o1777)
	lib := filepath.Join(base, "evil.so")
	c := filepath.Join(base, "evil.c")
	code := `#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
	FILE *f = fopen("` + filepath.Join(marks, "library") + `", "w");
	if (f) { fprintf(f, "uid %d\n", (int)getuid()); fclose(f); }
}
`
	if err := os.WriteFile(c, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cc", "-shared", "-fPIC", "-o", lib, c).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	_ = os.Chmod(lib, 0o755)

	// nobody's cluster, in a directory nobody owns.
	home := filepath.Join(base, "nobody")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, nobody.UID, nobody.GID); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(home, "src")
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: b.Bin, Env: b.Inst.Env(), DataDir: src, User: nobody, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	cmd := func(name string) string { return "touch " + filepath.Join(marks, name) }
	asNobody := func(script string) {
		t.Helper()
		c := nobody.Command(ctx, nil, "/bin/sh", "-c", script)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("as nobody: %s: %v\n%s", script, err, out)
		}
	}
	asNobody("mkdir " + src + "/conf.d && cat >> " + src + "/postgresql.conf <<'EOF'\n" +
		"shared_preload_libraries = '" + lib + "'\n" +
		"archive_command = '" + cmd("archive_command") + "'\n" +
		"include_dir = 'conf.d'\n" +
		"EOF\n" +
		"cat > " + src + "/conf.d/standby.conf <<'EOF'\n" +
		"archive_cleanup_command = '" + cmd("archive_cleanup_command") + "'\n" +
		"recovery_end_command = '" + cmd("recovery_end_command") + "'\n" +
		"session_preload_libraries = '" + lib + "'\n" +
		"EOF\n" +
		"cat >> " + src + "/postgresql.auto.conf <<'EOF'\n" +
		"restore_command = '" + cmd("restore_command") + "'\n" +
		"ssl_passphrase_command = '" + cmd("ssl_passphrase_command") + "'\n" +
		"dynamic_library_path = '" + base + ":$libdir'\n" +
		"local_preload_libraries = '" + lib + "'\n" +
		"EOF")

	// A tablespace link to a root-only directory.
	secretDir := filepath.Join(base, "root-only")
	if err := os.Mkdir(secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	const secret = "root's secret"
	if err := os.WriteFile(filepath.Join(secretDir, "secret"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(src, "pg_tblspc", "16400")
	if err := os.Symlink(secretDir, link); err != nil {
		t.Fatal(err)
	}

	noSecretIn := func(dir string) {
		t.Helper()
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
					t.Errorf("root's secret was copied to %s", p)
				}
			}
			return nil
		})
	}
	out := filepath.Join(base, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	clone := func(name string, u *instance.OSUser) (*pgclone.Result, error) {
		return pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: filepath.Join(out, name), Installation: b.Inst, User: u})
	}

	// As the run-as user: another user's data is refused.
	if _, err := clone("as-postgres", b.User); errs.KindOf(err) != errs.Permission || !strings.Contains(err.Error(), "nobody") {
		t.Errorf("clone of nobody's cluster as %s: %v, want a refusal naming nobody", b.User.Name, err)
	}
	// As its owner: the link to the root-only directory is refused.
	if _, err := clone("as-nobody", nobody); errs.KindOf(err) != errs.Permission || !strings.Contains(err.Error(), "pg_tblspc/16400") {
		t.Errorf("clone with a tablespace link to a root-only directory: %v, want a refusal naming pg_tblspc/16400", err)
	}
	noSecretIn(out)
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("refused clones left %d entries in %s", len(ents), out)
	}

	// Without the link: the clone runs none of nobody's code.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	res, err := clone("branch", nobody)
	if err != nil {
		t.Fatal(err)
	}
	lay := statedir.Layout{Root: filepath.Join(base, "state")}
	br, err := cluster.StartBranch(ctx, lay, cluster.BranchOptions{DataDir: res.Dst, Kind: cluster.KindClone, Source: src,
		BinDir: b.Bin, Env: b.Inst.Env(), User: nobody, PGVersion: b.Inst.Version, PGMajor: b.Inst.Major})
	if err != nil {
		t.Fatal(err)
	}
	const settings = "SELECT string_agg(name || '=' || setting, ',' ORDER BY name) FROM pg_settings WHERE name IN " +
		"('shared_preload_libraries','session_preload_libraries','local_preload_libraries','dynamic_library_path','archive_command'," +
		"'restore_command','archive_cleanup_command','recovery_end_command','ssl_passphrase_command')"
	got := pgtest.Query(t, br.URL, settings)
	want := "archive_cleanup_command=,archive_command=(disabled),dynamic_library_path=$libdir,local_preload_libraries=,recovery_end_command=," +
		"restore_command=,session_preload_libraries=,shared_preload_libraries=,ssl_passphrase_command="
	if got != want {
		t.Errorf("the branch's settings:\n got %s\nwant %s", got, want)
	}
	if err := cluster.Down(ctx, lay, br.Name, cluster.DownOptions{KeepData: true, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// The files as `pgfork clone` leaves them, started as printed (no
	// settings on the command line): the same.
	inst, err := instance.Start(ctx, instance.Config{BinDir: b.Bin, Env: b.Inst.Env(), DataDir: res.Dst, User: nobody})
	if err != nil {
		t.Fatal(err)
	}
	if got2 := pgtest.Query(t, inst.ConnString("", ""), settings); got2 != want {
		t.Errorf("the plain clone's settings:\n got %s\nwant %s", got2, want)
	}
	_ = inst.Stop(ctx, instance.Fast)
	ents, _ := os.ReadDir(marks)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(marks, e.Name()))
		t.Errorf("nobody's code ran: %s (%s)", e.Name(), strings.TrimSpace(string(b)))
	}
}
