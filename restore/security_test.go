package restore

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbackup"
)

// smallChain takes a full backup and one incremental of a small pgbench
// cluster, owned by the cluster's OS user (a backup someone else made, as
// root restores it).
func smallChain(t *testing.T, e pgEnv, base string) []string {
	t.Helper()
	_, in := e.newCluster(t, base, "src", nil)
	e.pgbench(t, in, "-i", "-s", "1", "-q")
	full, incr := filepath.Join(base, "full"), filepath.Join(base, "incr")
	e.basebackup(t, in, full, "")
	e.pgbench(t, in, "-n", "-t", "200")
	e.basebackup(t, in, incr, full)
	if e.User != nil {
		for _, d := range []string{full, incr} {
			if err := e.User.Chown(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	return []string{full, incr}
}

// asUser runs a shell command as the cluster's OS user, as the hostile
// "postgres" user of issue 19 would, and reports whether it succeeded.
func (e pgEnv) asUser(t *testing.T, script string) bool {
	t.Helper()
	cmd := e.User.Command(context.Background(), nil, "/bin/sh", "-c", script)
	return cmd.Run() == nil
}

// rootOnlyDir is a 0700 root directory standing for /etc: nothing may
// ever be written into it.
func rootOnlyDir(t *testing.T, base string) string {
	t.Helper()
	d := filepath.Join(base, "etc-standin")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func checkEmpty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 0 {
		t.Errorf("%s was written into: %v %v", dir, ents, err)
	}
}

// TestRestoreAsRootIgnoresSwaps (issue 19, F4): as root over a backup owned
// by another user, into a directory that user can write, every swap the
// user tries while root builds the result fails or is caught: at every
// directory root creates, the user tries to replace it with a symlink to a
// root-only directory (it cannot even reach the staging directory, which
// stays root's and private until it is complete); at chosen points the
// user renames the staging directory away and plants a symlink in its
// place (possible: the parent is the user's), which the hand-over refuses.
// Nothing is ever written into the root-only directory. Before the fix,
// root created the staging tree owned by the user and wrote by path.
func TestRestoreAsRootIgnoresSwaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on root restoring for another user")
	}
	e := newestPG(t)
	base := testenv.Dir(t)
	dirs := smallChain(t, e, base)
	etc := rootOnlyDir(t, base)
	parent := filepath.Join(base, "users-dir")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(parent, e.User.UID, e.User.GID); err != nil {
		t.Fatal(err)
	}
	defer func() { testHookAfterMkdir = nil }()

	t.Run("every directory", func(t *testing.T) {
		var mu sync.Mutex
		tried, swapped := 0, 0
		testHookAfterMkdir = func(staging, rel string) {
			mu.Lock()
			defer mu.Unlock()
			tried++
			p := filepath.Join(staging, filepath.FromSlash(rel))
			if e.asUser(t, "rm -rf '"+p+"' && ln -s '"+etc+"' '"+p+"'") {
				swapped++
			}
		}
		dst := filepath.Join(parent, "restored")
		sum, err := Restore(context.Background(), dirs, dst, Options{Sync: clone.SyncNone, Owner: e.owner()})
		testHookAfterMkdir = nil
		if err != nil {
			t.Fatal(err)
		}
		if tried < 5 || swapped != 0 {
			t.Errorf("the user tried %d swaps and %d succeeded; want many tries, none succeeding", tried, swapped)
		}
		checkEmpty(t, etc)
		fi, err := os.Stat(dst)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != e.User.UID || fi.Mode().Perm() != 0o700 {
			t.Errorf("result: owner %d mode %v, want %d and 0700", st.Uid, fi.Mode().Perm(), e.User.UID)
		}
		if sum.Files == 0 {
			t.Error("nothing restored")
		}
	})

	for _, at := range []int{1, 5, -1} {
		t.Run("staging renamed at directory "+map[int]string{1: "1", 5: "5", -1: "last"}[at], func(t *testing.T) {
			dst := filepath.Join(parent, "renamed"+strings.ReplaceAll(t.Name()[len(t.Name())-2:], "/", ""))
			n, total := 0, 0
			// Count the directories once, to hit the last one.
			if at < 0 {
				testHookAfterMkdir = func(string, string) { total++ }
				probe := filepath.Join(parent, "probe")
				if _, err := Restore(context.Background(), dirs, probe, Options{Sync: clone.SyncNone, Owner: e.owner()}); err != nil {
					t.Fatal(err)
				}
				at = total
			}
			testHookAfterMkdir = func(staging, rel string) {
				n++
				if n != at {
					return
				}
				if !e.asUser(t, "mv '"+staging+"' '"+staging+".moved' && ln -s '"+etc+"' '"+staging+"'") {
					t.Errorf("the user could not rename the staging directory in its own directory (the test's premise)")
				}
			}
			_, err := Restore(context.Background(), dirs, dst, Options{Sync: clone.SyncNone, Owner: e.owner()})
			testHookAfterMkdir = nil
			if err == nil || !strings.Contains(err.Error(), "replaced") {
				t.Errorf("restore after the staging directory was swapped: %v, want a refusal", err)
			}
			checkEmpty(t, etc)
			if fi, err := os.Lstat(dst); err == nil {
				t.Errorf("%s exists (%v) after a refused restore", dst, fi.Mode())
			}
		})
	}
}

// TestRestoreRefusesTamperedBackups (issue 19: F1, F2, F3, F17, F18 and
// the INCREMENTAL file in a full backup): each tampering is refused with
// the file named, and nothing appears at the destination.
func TestRestoreRefusesTamperedBackups(t *testing.T) {
	e := newestPG(t)
	base := testenv.Dir(t)
	pristine := smallChain(t, e, base)
	secretDir := rootOnlyDir(t, base)
	secret := filepath.Join(secretDir, "secret")
	if err := os.WriteFile(secret, []byte("root's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := 0
	copyChain := func(t *testing.T) (full, incr string) {
		n++
		d := filepath.Join(base, "case"+string(rune('a'+n)))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range pristine {
			if out, err := exec.Command("cp", "-a", s, d).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
		}
		return filepath.Join(d, "full"), filepath.Join(d, "incr")
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// A file that the full backup holds whole and the incremental holds as
	// an INCREMENTAL file (a relation that changed).
	incFile := func(t *testing.T, incr string) (rel string) {
		m, _ := filepath.Glob(filepath.Join(incr, "base", "*", "INCREMENTAL.*"))
		if len(m) == 0 {
			t.Fatal("no INCREMENTAL file in the incremental backup")
		}
		r, _ := filepath.Rel(incr, m[0])
		return filepath.Join(filepath.Dir(r), strings.TrimPrefix(filepath.Base(r), "INCREMENTAL."))
	}

	for _, c := range []struct {
		name   string
		tamper func(t *testing.T, full, incr string) (dst string)
		msg    string
	}{
		{"F1 symlink in the older backup", func(t *testing.T, full, incr string) string {
			rel := incFile(t, incr)
			must(t, os.Remove(filepath.Join(full, rel)))
			must(t, os.Symlink(secret, filepath.Join(full, rel)))
			return ""
		}, "symbolic link"},
		{"F1 symlinked directory in the older backup", func(t *testing.T, full, incr string) string {
			rel := incFile(t, incr)
			dir := filepath.Join(full, filepath.Dir(rel))
			must(t, os.Rename(dir, dir+".real"))
			must(t, os.Symlink(dir+".real", dir))
			return ""
		}, "symbolic link"},
		{"symlink in the newest backup", func(t *testing.T, full, incr string) string {
			must(t, os.Symlink(secret, filepath.Join(incr, "base", "extra")))
			return ""
		}, "symbolic link"},
		{"F2 file of the manifest missing", func(t *testing.T, full, incr string) string {
			m, _ := filepath.Glob(filepath.Join(incr, "base", "*", "PG_VERSION"))
			must(t, os.Remove(m[0]))
			return ""
		}, "present in the backup's manifest but not on disk"},
		{"F2 file of another size", func(t *testing.T, full, incr string) string {
			must(t, os.WriteFile(filepath.Join(incr, "PG_VERSION"), []byte("18\n\n"), 0o600))
			return ""
		}, "in the backup's manifest"},
		{"F17 backup_label is a FIFO", func(t *testing.T, full, incr string) string {
			must(t, os.Remove(filepath.Join(incr, "backup_label")))
			must(t, syscall.Mkfifo(filepath.Join(incr, "backup_label"), 0o600))
			return ""
		}, "backup_label"},
		{"F17 backup_manifest is /dev/zero", func(t *testing.T, full, incr string) string {
			must(t, os.Remove(filepath.Join(incr, "backup_manifest")))
			must(t, os.Symlink("/dev/zero", filepath.Join(incr, "backup_manifest")))
			return ""
		}, "backup manifest"},
		{"F18 pg_control with a wrong CRC", func(t *testing.T, full, incr string) string {
			p := filepath.Join(incr, "global", "pg_control")
			b, err := os.ReadFile(p)
			must(t, err)
			b[100] ^= 0xff
			must(t, os.WriteFile(p, b, 0o600))
			return ""
		}, "CRC is incorrect"},
		{"F3 destination inside a backup by a symlinked path", func(t *testing.T, full, incr string) string {
			link := filepath.Join(filepath.Dir(full), "link-to-full")
			must(t, os.Symlink(full, link))
			return filepath.Join(link, "restored-inside")
		}, "inside a backup"},
		{"full backup holding an INCREMENTAL file", func(t *testing.T, full, incr string) string {
			rel := incFile(t, incr)
			must(t, os.Remove(filepath.Join(full, rel)))
			inc := filepath.Join(full, filepath.Dir(rel), "INCREMENTAL."+filepath.Base(rel))
			var hdr [12]byte
			binary.LittleEndian.PutUint32(hdr[0:], 0xd3ae1f0d)
			binary.LittleEndian.PutUint32(hdr[8:], 1) // no blocks; one block long
			must(t, os.WriteFile(inc, hdr[:], 0o600))
			// The manifest made to match, as a careful tamperer (or
			// PostgreSQL's own test) would: only the rebuild can tell.
			m, err := pgbackup.ReadManifest(filepath.Join(full, "backup_manifest"))
			must(t, err)
			sysid := m.SystemID
			w := pgbackup.NewManifestWriter(m.Version, sysid)
			for p, f := range m.Files {
				if p == filepath.ToSlash(rel) {
					continue
				}
				w.Add(p, f.Size, time.Now(), f.Algorithm, f.Checksum)
			}
			w.Add(filepath.ToSlash(filepath.Join(filepath.Dir(rel), "INCREMENTAL."+filepath.Base(rel))), 12, time.Now(), "", nil)
			must(t, os.WriteFile(filepath.Join(full, "backup_manifest"), w.Finish(m.WAL), 0o600))
			return ""
		}, "full backup contains unexpected incremental file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			full, incr := copyChain(t)
			dst := c.tamper(t, full, incr)
			if dst == "" {
				dst = filepath.Join(filepath.Dir(full), "out")
			}
			done := make(chan error, 1)
			go func() {
				_, err := Restore(context.Background(), []string{full, incr}, dst, Options{Sync: clone.SyncNone, Owner: e.owner()})
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("restore hung")
			}
			if err == nil || !strings.Contains(err.Error(), c.msg) || errs.KindOf(err) == errs.Internal {
				t.Fatalf("restore of a tampered chain: %v (kind %v), want a refusal saying %q", err, errs.KindOf(err), c.msg)
			}
			if _, err := os.Lstat(dst); err == nil {
				t.Errorf("%s exists after a refused restore", dst)
			}
			if b, _ := os.ReadFile(secret); !bytes.Equal(b, []byte("root's secret")) {
				t.Error("the root-only file changed")
			}
		})
	}
}
