package restore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestRestoreRefusesBadChains checks that broken chains, tar-format
// backups, backups without a manifest and an existing destination are
// refused with a clear error before anything is written.
func TestRestoreRefusesBadChains(t *testing.T) {
	e := newestPG(t)
	{
		base := testenv.Dir(t)
		_, in := e.newCluster(t, base, "src", nil)
		b := func(n string) string { return filepath.Join(base, n) }
		e.basebackup(t, in, b("b0"), "")
		e.pgbench(t, in, "-i", "-s", "1", "-q")
		e.basebackup(t, in, b("b1"), b("b0"))
		e.pgbench(t, in, "-n", "-t", "50")
		e.basebackup(t, in, b("b2"), b("b1"))
		e.basebackup(t, in, b("tar"), "", "-Ft")
		e.basebackup(t, in, b("nomanifest"), "", "--no-manifest")
		_, other := e.newCluster(t, base, "other", map[string]string{"port": "0"})
		e.basebackup(t, other, b("otherfull"), "")
		if err := os.Mkdir(b("exists"), 0o755); err != nil {
			t.Fatal(err)
		}

		for _, tc := range []struct {
			name string
			dirs []string
			dst  string
			kind errs.Kind
			msg  string
			hint string
		}{
			{"gap", []string{b("b0"), b("b2")}, "", errs.Usage, "b2 does not continue b0", "a backup is missing"},
			{"wrong order", []string{b("b0"), b("b2"), b("b1")}, "", errs.Usage, "b2 does not continue b0", "put b1 right before it"},
			{"incremental first", []string{b("b1"), b("b2")}, "", errs.Usage, "first backup is an incremental", "full backup first"},
			{"full in the middle", []string{b("b0"), b("otherfull")}, "", errs.Usage, "full backup in the middle", ""},
			{"different system", []string{b("otherfull"), b("b1")}, "", errs.Usage, "another cluster", "same cluster"},
			{"tar format", []string{b("tar")}, "", errs.Unsupported, "tar-format", "pg_basebackup -Fp"},
			{"no manifest", []string{b("nomanifest")}, "", errs.NotFound, "no backup_manifest", "without --no-manifest"},
			{"missing dir", []string{b("nope")}, "", errs.NotFound, "no such backup", ""},
			{"dst exists", []string{b("b0"), b("b1")}, b("exists"), errs.Exists, "already exists", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dst := tc.dst
				if dst == "" {
					dst = filepath.Join(base, "out-"+strings.ReplaceAll(tc.name, " ", "-"))
				}
				_, err := Restore(context.Background(), tc.dirs, dst, Options{Sync: clone.SyncNone})
				if err == nil {
					t.Fatal("restore succeeded")
				}
				if errs.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(errs.HintOf(err), tc.hint) {
					t.Errorf("got %v error %q (hint %q), want %v containing %q (hint %q)", errs.KindOf(err), err, errs.HintOf(err), tc.kind, tc.msg, tc.hint)
				}
				if tc.dst == "" {
					if _, err := os.Lstat(dst); err == nil {
						t.Errorf("%s was created", dst)
					}
				} else if ents, _ := os.ReadDir(dst); len(ents) != 0 {
					t.Errorf("the existing destination was written")
				}
				if l := leftovers(dst); len(l) > 0 {
					t.Errorf("left behind: %v", l)
				}
			})
		}
	}
}

// TestRestoreKilled kills a restore (kill -9) in the middle: the
// destination must not exist, the backups must be unchanged, and the next
// restore to the same destination cleans up and succeeds.
func TestRestoreKilled(t *testing.T) {
	e := newestPG(t)
	{
		pgtest.ForEachFS(t, func(t *testing.T, base string) {
			_, in := e.newCluster(t, base, "src", nil)
			e.pgbench(t, in, "-i", "-s", "1", "-q")
			b0, b1 := filepath.Join(base, "b0"), filepath.Join(base, "b1")
			e.basebackup(t, in, b0, "")
			e.pgbench(t, in, "-n", "-t", "100")
			e.basebackup(t, in, b1, b0)
			pgtest.Stop(t, in)
			before0, before1 := testenv.TreeHash(t, b0), testenv.TreeHash(t, b1)
			dst := filepath.Join(base, "restored")

			cmd := exec.Command(os.Args[0], "-test.run=^TestRestoreChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "PGFORK_RESTORE_CHILD="+b0+":"+b1+":"+dst)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			killed := false
			deadline := time.Now().Add(3 * time.Minute)
			for time.Now().Before(deadline) && !killed {
				for _, l := range leftovers(dst) {
					if n := countFiles(l); n > 100 {
						_ = cmd.Process.Signal(syscall.SIGKILL)
						killed = true
						t.Logf("killed with %d files in %s", n, filepath.Base(l))
						break
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			_ = cmd.Wait()
			if !killed {
				t.Fatal("the restore did not get far enough to be killed")
			}
			if _, err := os.Lstat(dst); err == nil {
				t.Errorf("%s exists after the restore was killed", dst)
			}
			testenv.SameTree(t, "full backup", before0, testenv.TreeHash(t, b0))
			testenv.SameTree(t, "incremental backup", before1, testenv.TreeHash(t, b1))

			if _, err := Restore(context.Background(), []string{b0, b1}, dst, Options{Sync: clone.SyncNone}); err != nil {
				t.Fatal(err)
			}
			if l := leftovers(dst); len(l) > 0 {
				t.Errorf("the next restore left the killed one's staging behind: %v", l)
			}
			e.Tool(t, "pg_verifybackup", "-n", dst)
		})
	}
}

func countFiles(dir string) int {
	n := 0
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}

// TestRestoreChild is the restore that TestRestoreKilled kills; it runs
// only in that child process, slowed down after each file.
func TestRestoreChild(t *testing.T) {
	spec := os.Getenv("PGFORK_RESTORE_CHILD")
	if spec == "" {
		return // only does something as TestRestoreKilled's child process
	}
	p := strings.Split(spec, ":")
	testHookAfterFile = func() { time.Sleep(20 * time.Millisecond) }
	_, err := Restore(context.Background(), p[:len(p)-1], p[len(p)-1], Options{Sync: clone.SyncNone, Jobs: 1})
	fmt.Println("child finished:", err)
}
