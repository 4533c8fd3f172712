package pgclone_test

import (
	"context"
	"os"
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
	b := pgtest.Builds(t, 0)[0]
	ctx := context.Background()
	base := testenv.Dir(t)
	h := pgtest.NewHostile(t, base, b.Bin, b.Inst.Env())
	src, nobody := h.Data, pgtest.Nobody
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
	h.CheckSecretNotIn(t, out)
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("refused clones left %d entries in %s", len(ents), out)
	}

	// Without the link: the clone runs none of nobody's code.
	if err := os.Remove(h.Link); err != nil {
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
	h.CheckNothingRan(t)
}
