package pgbin_test

import (
	"debug/elf"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
)

// TestBuildLoadsItsOwnLibraries (issue 32, F7): every program and shared
// object of a build that keeps its own libraries (the builds of `pgfork pg
// install` in the test environment, installed before the fix too) loads
// each library the build ships from the build itself when run with the
// installation's environment, never the system's: the builds' libraries
// carry RUNPATH /opt/postgresql/lib, so libpqwalreceiver.so used to load
// the system's libpq and a standby never streamed.
func TestBuildLoadsItsOwnLibraries(t *testing.T) {
	ldd, err := exec.LookPath("ldd")
	if err != nil {
		t.Skip("no ldd")
	}
	checked := 0
	for _, d := range testenv.PGBinDirs(t) {
		in, err := pgbin.Find(pgbin.Options{Explicit: d}, 0)
		if err != nil {
			t.Fatal(err)
		}
		lib := filepath.Join(filepath.Dir(in.BinDir), "lib")
		if _, err := os.Stat(filepath.Join(lib, "libpq.so.5")); err != nil {
			continue // links against the system's libraries (Debian)
		}
		own := map[string]bool{}
		ents, _ := os.ReadDir(lib)
		for _, e := range ents {
			own[e.Name()] = true
		}
		env := instance.MinimalEnv(in.Env())
		for _, top := range []string{in.BinDir, lib} {
			_ = filepath.WalkDir(top, func(p string, de fs.DirEntry, err error) error {
				if err != nil || !de.Type().IsRegular() {
					return nil
				}
				f, err := elf.Open(p)
				if err != nil {
					return nil
				}
				needed, _ := f.ImportedLibraries()
				f.Close()
				var mine []string
				for _, n := range needed {
					if own[n] {
						mine = append(mine, n)
					}
				}
				if len(mine) == 0 {
					return nil
				}
				cmd := exec.Command(ldd, p)
				cmd.Env = env
				out, err := cmd.Output()
				if err != nil {
					t.Errorf("ldd %s: %v", p, err)
					return nil
				}
				for _, n := range mine {
					want := n + " => " + filepath.Join(lib, n) + " "
					if !strings.Contains(string(out), want) {
						t.Errorf("%s loads %s from outside its build (%s):\n%s", p, n, lib, out)
					}
				}
				checked++
				return nil
			})
		}
	}
	if checked == 0 {
		t.Skip("no build with libraries of its own in the test environment")
	}
	t.Logf("%d programs and libraries checked", checked)
}
