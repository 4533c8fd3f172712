// Package pgbin finds PostgreSQL installations, several majors side by side,
// and installs more of them into pgfork's state directory.
//
// Discovery looks, in order, at: an explicit bin directory (the --pg-bin flag,
// or $PGFORK_PG_BIN), `pg_config --bindir` of the pg_config on PATH, the
// directory of `postgres` on PATH, /usr/lib/postgresql/*/bin,
// /usr/local/pgsql/bin, and pgfork's managed installs
// <state>/installs/<version>/bin. Installations are deduplicated by the real
// path of their bin directory (the first source that found one names it) and
// sorted newest first. The version comes from `postgres --version`.
//
// pgbin owns where PostgreSQL builds are (SearchDirs is the one list of
// places) and how a managed one is installed. It must not run a server or
// touch a data directory (package instance and pgdata do).
package pgbin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgversion"
	"github.com/pgfork/pgfork/internal/statedir"
)

// EnvBin is the environment variable naming an explicit PostgreSQL bin
// directory, used when Options.Explicit is empty.
const EnvBin = "PGFORK_PG_BIN"

// Sources of an Installation, in discovery order.
const (
	SourceFlag     = "flag"
	SourceEnv      = "env"
	SourcePGConfig = "pg_config"
	SourcePATH     = "PATH"
	SourceSystem   = "system"
	SourceManaged  = "managed"
)

// Installation is one PostgreSQL build: a bin directory with postgres,
// initdb and the other tools of one version.
type Installation struct {
	// BinDir is the directory holding postgres, initdb, pg_ctl...
	BinDir string `json:"bin_dir"`
	// Version is what `postgres --version` reports, e.g. "15.18" or "18beta1".
	Version string `json:"version"`
	// Major is the major version, e.g. 15.
	Major int `json:"major"`
	// Source says how it was found: flag, env, pg_config, PATH, system, managed.
	Source string `json:"source"`
}

// Tool returns the path of one of the installation's programs, e.g. "initdb".
func (i Installation) Tool(name string) string { return filepath.Join(i.BinDir, name) }

// Env returns extra environment entries ("KEY=value") needed to run the
// installation's programs, or nil when none are needed. A build that keeps
// its own libpq in ../lib (a build of `pgfork pg install`, a build from
// source) gets LD_LIBRARY_PATH naming that directory first, whatever its
// programs' rpath or runpath say: the builds `pgfork pg install` fetches
// carry RUNPATH $ORIGIN/../lib on their programs but /opt/postgresql/lib
// (where they were built) on their libraries, so without it the server's
// walreceiver (libpqwalreceiver.so) loaded the system's libpq, of another
// major, and a standby never streamed (issue 32, F7). LD_LIBRARY_PATH is
// searched before every RUNPATH, so each shared object of the build finds
// the build's own libraries. Debian's packages link against the system's
// libpq (none in their lib directory) and need nothing.
func (i Installation) Env() []string {
	lib := filepath.Join(filepath.Dir(i.BinDir), "lib")
	if _, err := os.Stat(filepath.Join(lib, "libpq.so.5")); err != nil {
		return nil
	}
	v := lib
	if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
		v += ":" + old
	}
	return []string{"LD_LIBRARY_PATH=" + v}
}

// String describes the installation for messages.
func (i Installation) String() string {
	return fmt.Sprintf("PostgreSQL %s in %s (%s)", i.Version, i.BinDir, i.Source)
}

// Options says where to look besides the standard places.
type Options struct {
	// Explicit is a bin directory given by the user (--pg-bin). It may also
	// name the installation prefix (the directory holding bin/). When empty,
	// $PGFORK_PG_BIN is used.
	Explicit string
	// StateDir is pgfork's state directory, whose installs/ holds managed
	// builds. Empty means statedir.Default().
	StateDir string
}

// The system places Discover looks in, besides pg_config, PATH and
// pgfork's installs.
const (
	debianRoot = "/usr/lib/postgresql"  // Debian and Ubuntu: one <major>/bin per major
	sourceBin  = "/usr/local/pgsql/bin" // where a build from source installs by default
)

func installsDir(stateDir string) string {
	if stateDir == "" {
		stateDir = statedir.Default()
	}
	return statedir.Layout{Root: stateDir}.Installs()
}

// SearchDirs lists the directories, besides those on PATH, whose entries
// decide what Discover finds with pgfork's state in stateDir: a major
// installed or removed there changes their modification times. Callers that
// remember Discover's answer between runs key it on them.
func SearchDirs(stateDir string) []string {
	dirs := []string{debianRoot, filepath.Dir(sourceBin), sourceBin, installsDir(stateDir)}
	sys, _ := filepath.Glob(debianRoot + "/*/bin")
	return append(dirs, sys...)
}

type candidate struct {
	dir    string
	source string
}

// versionTimeout bounds one `postgres --version` call.
const versionTimeout = 10 * time.Second

// Discover returns every installation found, deduplicated by the real path of
// the bin directory and sorted newest first. An explicit directory that holds
// no working postgres is an error (the user asked for it); everything else
// that does not work is silently passed over.
func Discover(opts Options) ([]Installation, error) {
	explicit, err := explicitInstall(opts)
	if err != nil {
		return nil, err
	}
	var cands []candidate
	if d, err := pgConfigBinDir(); err == nil && d != "" {
		cands = append(cands, candidate{d, SourcePGConfig})
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			p = rp
		}
		cands = append(cands, candidate{filepath.Dir(p), SourcePATH})
	}
	sys, _ := filepath.Glob(debianRoot + "/*/bin")
	for _, d := range sys {
		cands = append(cands, candidate{d, SourceSystem})
	}
	cands = append(cands, candidate{sourceBin, SourceSystem})
	managed, _ := filepath.Glob(filepath.Join(installsDir(opts.StateDir), "*", "bin"))
	for _, d := range managed {
		if validVersionDir(filepath.Base(filepath.Dir(d))) {
			cands = append(cands, candidate{d, SourceManaged})
		}
	}

	var out []Installation
	seen := map[string]bool{}
	if explicit != nil {
		out = append(out, *explicit)
		seen[realDir(explicit.BinDir)] = true
	}
	for _, c := range cands {
		rd := realDir(c.dir)
		if seen[rd] {
			continue
		}
		inst, err := probe(c.dir, c.source)
		if err != nil {
			continue
		}
		seen[rd] = true
		out = append(out, inst)
	}
	sort.SliceStable(out, func(a, b int) bool {
		return compareVersions(out[a].Version, out[b].Version) > 0
	})
	return out, nil
}

// Find returns the installation to use for a major version. Major 0 means
// the explicit one if given, else the newest found. When an explicit
// directory is given with a major it does not have, that is a usage error.
// A missing major is errs.NotFound with the hint to install it.
func Find(opts Options, major int) (Installation, error) {
	explicit, err := explicitInstall(opts)
	if err != nil {
		return Installation{}, err
	}
	if explicit != nil {
		if major != 0 && explicit.Major != major {
			return Installation{}, errs.New(errs.Usage, "the PostgreSQL build given explicitly is version %s, not major %d", explicit.Version, major).
				WithPath(explicit.BinDir).
				WithHint("give either a build or a major version, not both").WithCLI("drop --pg-bin/$%s to choose by major, or drop --pg to use this build", EnvBin)
		}
		return *explicit, nil
	}
	all, err := Discover(opts)
	if err != nil {
		return Installation{}, err
	}
	for _, in := range all {
		if major == 0 || in.Major == major {
			return in, nil
		}
	}
	if major == 0 {
		return Installation{}, errs.New(errs.NotFound, "no PostgreSQL installation found (looked at pg_config and postgres on PATH, /usr/lib/postgresql/*/bin, /usr/local/pgsql/bin and pgfork's installs)").
			WithHint("install PostgreSQL").WithCLI("install one with `pgfork pg install 18`, or point --pg-bin at a PostgreSQL bin directory")
	}
	var have []string
	for _, in := range all {
		have = append(have, in.Version)
	}
	msg := fmt.Sprintf("PostgreSQL %d is not installed", major)
	if len(have) > 0 {
		msg += " (found " + strings.Join(have, ", ") + ")"
	}
	return Installation{}, errs.New(errs.NotFound, "%s", msg).WithHint("install PostgreSQL %d", major).WithCLI("pgfork pg install %d", major)
}

func explicitInstall(opts Options) (*Installation, error) {
	dir, source := opts.Explicit, SourceFlag
	if dir == "" || dir == os.Getenv(EnvBin) {
		// The CLI's --pg-bin defaults to $PGFORK_PG_BIN: say where it came from.
		dir, source = os.Getenv(EnvBin), SourceEnv
		if dir == "" {
			dir = opts.Explicit
		}
	}
	if dir == "" {
		return nil, nil
	}
	abs, err := filepath.Abs(dir)
	if err == nil {
		dir = abs
	}
	// Accept the installation prefix or the postgres binary itself too.
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() && filepath.Base(dir) == "postgres" {
		dir = filepath.Dir(dir)
	} else if _, err := os.Stat(filepath.Join(dir, "postgres")); err != nil {
		if _, err2 := os.Stat(filepath.Join(dir, "bin", "postgres")); err2 == nil {
			dir = filepath.Join(dir, "bin")
		}
	}
	inst, err := probe(dir, source)
	if err != nil {
		what := "--pg-bin"
		if source == SourceEnv {
			what = "$" + EnvBin
		}
		reason := err.Error()
		if e := (*errs.Error)(nil); errors.As(err, &e) {
			reason = e.Msg
			if e.Err != nil && !errors.Is(e.Err, os.ErrNotExist) {
				reason += ": " + e.Err.Error()
			}
		}
		return nil, errs.New(errs.NotFound, "%s does not name a working PostgreSQL bin directory (%s)", what, reason).
			WithPath(dir).
			WithHint("point %s at the directory holding postgres and initdb (e.g. /usr/lib/postgresql/15/bin), or unset it", what)
	}
	return &inst, nil
}

func realDir(d string) string {
	if rd, err := filepath.EvalSymlinks(d); err == nil {
		return rd
	}
	return filepath.Clean(d)
}

func pgConfigBinDir() (string, error) {
	p, err := exec.LookPath("pg_config")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), versionTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--bindir").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// probe checks that dir holds a runnable postgres and asks its version.
func probe(dir, source string) (Installation, error) {
	inst := Installation{BinDir: dir, Source: source}
	pg := inst.Tool("postgres")
	fi, err := os.Stat(pg)
	if err != nil {
		return inst, errs.Wrap(errs.NotFound, err, "no postgres program").WithPath(dir)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return inst, errs.New(errs.NotFound, "postgres is not an executable file").WithPath(pg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), versionTimeout)
	defer cancel()
	v, err := ToolVersion(ctx, pg, inst.Env())
	if err != nil {
		return inst, err
	}
	inst.Version = v
	inst.Major, err = MajorOf(v)
	if err != nil {
		return inst, errs.Wrap(errs.Internal, err, "cannot read the version of postgres").WithPath(pg)
	}
	return inst, nil
}

// ToolVersion runs `prog --version` (with env added to the environment) and
// returns the version it reports, e.g. "15.18".
func ToolVersion(ctx context.Context, prog string, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, prog, "--version")
	cmd.Env = append(append(os.Environ(), "LC_ALL=C"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return "", errs.Wrap(errs.Internal, err, "`%s --version` failed", filepath.Base(prog)).WithPath(prog)
	}
	v, err := pgversion.FromToolOutput(out)
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "unexpected output of %s", filepath.Base(prog)).WithPath(prog)
	}
	return v, nil
}

// MajorOf returns the major version of a PostgreSQL version string: 15 for
// "15.18", 18 for "18beta1" (pgversion.Major).
func MajorOf(version string) (int, error) { return pgversion.Major(version) }

var (
	numRe = regexp.MustCompile(`\d+`)
	preRe = regexp.MustCompile(`(alpha|beta|rc|devel)`)
)

// compareVersions orders versions numerically part by part; a pre-release
// ("18beta1") sorts before the release ("18.0").
func compareVersions(a, b string) int {
	pa, pb := versionKey(a), versionKey(b)
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y int
		if i < len(pa) {
			x = pa[i]
		}
		if i < len(pb) {
			y = pb[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

func versionKey(v string) []int {
	pre := preRe.FindStringIndex(v)
	main := v
	var tail []int
	if pre != nil {
		main = v[:pre[0]]
		rank := map[string]int{"devel": 0, "alpha": 1, "beta": 2, "rc": 3}[v[pre[0]:pre[1]]]
		n := 0
		if rest := numRe.FindString(v[pre[1]:]); rest != "" {
			n, _ = strconv.Atoi(rest)
		}
		tail = []int{-1, rank, n} // below x.0
	}
	var key []int
	for _, s := range numRe.FindAllString(main, -1) {
		n, _ := strconv.Atoi(s)
		key = append(key, n)
	}
	if pre != nil {
		// "18beta1" vs "18.0": compare 18 then -1 (pre) < 0 (release).
		key = append(key, tail...)
	}
	return key
}

var versionDirRe = regexp.MustCompile(`^\d{1,3}(?:\.\d{1,3}){0,2}(?:(?:alpha|beta|rc)\d{1,3})?$`)

// validVersionDir reports whether name is a version fit to be a directory
// name under installs/ (digits and dots, optionally a pre-release suffix).
func validVersionDir(name string) bool { return versionDirRe.MatchString(name) }

// MissingMajor wraps err (Find found no build of major) with a message
// and the one advice pgfork gives for a missing major: install it, or name
// its bin directory.
func MissingMajor(err error, major int, format string, args ...any) *errs.Error {
	return errs.Wrap(errs.KindOf(err), err, format, args...).
		WithHint("install PostgreSQL %d, or name the bin directory of one", major).
		WithCLI("install it with `pgfork pg install %d`, or point --pg-bin at its bin directory", major)
}
