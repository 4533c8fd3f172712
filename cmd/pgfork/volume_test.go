//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/servelock"
	"github.com/pgfork/pgfork/internal/statedir"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/up"
	"github.com/pgfork/pgfork/volume"
)

// volumeHome makes a base state directory on the run directory's disk (ext4
// here: it cannot clone) and removes, at the end, whatever volume a test
// left: through pgfork (in-process), then by hand (lazy unmount, loop detached only
// when it is backed by this test's image).
func volumeHome(t *testing.T, p *pgfk) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("volume tests need root (loop devices, mount)")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		if testenv.Require() {
			t.Fatal("mkfs.xfs is missing (xfsprogs) but PGFORK_TEST_REQUIRE=1")
		}
		t.Skip("mkfs.xfs is missing (xfsprogs)")
	}
	home := filepath.Join(testenv.RunDir(t), "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	p.home = home
	t.Cleanup(func() {
		runInProcessEnv(t, nil, "--state-dir", home, "down", "--all", "--timeout", "1s")
		runInProcessEnv(t, nil, "--state-dir", home, "volume", "rm")
		mnt := filepath.Join(home, "volume")
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		if r, err := volume.Load(home); err == nil {
			if l := loopOf(t, r.Image); l != "" {
				_ = exec.Command("losetup", "-d", l).Run()
			}
		}
	})
	return home
}

// loopOf returns the loop device backed by image, or "".
func loopOf(t *testing.T, image string) string {
	t.Helper()
	out, err := exec.Command("losetup", "-j", image, "-O", "NAME", "-n").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func mounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func createVolume(t *testing.T, p *pgfk, size string) *volume.Record {
	t.Helper()
	r := p.run("volume", "create", "--size", size, "--json")
	if r.code != 0 {
		t.Fatalf("volume create: exit %d\n%s", r.code, r.stderr)
	}
	var rec volume.Record
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil {
		t.Fatalf("volume create --json: %v\n%s", err, r.stdout)
	}
	return &rec
}

// TestVolumeCreateUseRm: on ext4 a volume makes pgfork's clusters clones
// of their template (shared blocks on XFS); rm unmounts, detaches the loop
// device and removes the image, the mount point and the record, and leaves
// the rest of the state directory alone.
func TestVolumeCreateUseRm(t *testing.T) {
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	if pr, err := clone.Probe(t.Context(), home, home); err != nil || pr.Clone {
		t.Skipf("the run directory can clone already (%v): no ext4 to test on", err)
	}
	keep := filepath.Join(home, "keep-me")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := createVolume(t, p, "400M")
	if !mounted(t, rec.Mount) || loopOf(t, rec.Image) == "" {
		t.Fatalf("volume not mounted at %s from a loop device", rec.Mount)
	}
	res := p.up("--spares", "0")
	if !strings.HasPrefix(res.DataDir, rec.State+"/") {
		t.Errorf("cluster data dir %s is not on the volume (%s)", res.DataDir, rec.State)
	}
	if fst, _ := clone.FSType(res.DataDir); fst != "xfs" {
		t.Errorf("cluster on %s, want xfs", fst)
	}
	if ls := p.run("volume", "ls"); ls.code != 0 || !strings.Contains(ls.stdout, rec.Image) || !strings.Contains(ls.stdout, "true") {
		t.Errorf("volume ls: exit %d\n%s%s", ls.code, ls.stdout, ls.stderr)
	}
	if dirShared(t, res.DataDir) == 0 {
		t.Errorf("the cluster shares no blocks with its template: not cloned")
	}
	if r := p.run("volume", "rm"); r.code != 6 {
		t.Errorf("volume rm with a cluster running: exit %d, want 6 (busy)\n%s", r.code, r.stderr)
	}
	if r := p.run("down", "--all"); r.code != 0 {
		t.Fatalf("down: %s", r.stderr)
	}
	if r := p.run("volume", "rm"); r.code != 0 {
		t.Fatalf("volume rm: exit %d\n%s", r.code, r.stderr)
	}
	if mounted(t, rec.Mount) || loopOf(t, rec.Image) != "" {
		t.Errorf("volume still mounted or its loop device still attached")
	}
	for _, gone := range []string{rec.Image, rec.Mount, filepath.Join(home, "volume.json")} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("volume rm left %s", gone)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("volume rm removed something else: %v", err)
	}
}

func dirShared(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	_ = filepath.Walk(filepath.Join(dir, "base"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			s, _ := clone.SharedBytes(p)
			n += s
		}
		return nil
	})
	return n
}

// TestVolumeNeedsRoot: run by an unprivileged user, volume create exits 8
// and gives the command to run as root; nothing is made.
func TestVolumeNeedsRoot(t *testing.T) {
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Skip("no postgres user to run as")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(home, uid, gid); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"volume", "create", "--size", "400M"}, {"volume", "rm"}, {"volume", "grow", "--size", "1G"}} {
		cmd := exec.Command(p.bin, append([]string{"--state-dir", home}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		r := runCLI(t, cmd)
		if r.code != 8 {
			t.Errorf("%v as postgres: exit %d, want 8\n%s", args, r.code, r.stderr)
		}
		if !strings.Contains(r.stderr, "sudo pgfork "+strings.Join(args[:2], " ")) {
			t.Errorf("%v: the hint does not give the command to run as root:\n%s", args, r.stderr)
		}
	}
	if ents, _ := os.ReadDir(home); len(ents) != 0 {
		t.Errorf("refused create left %d entries in %s", len(ents), home)
	}
}

// TestVolumeRefusesNonEmptyMountPoint: a mount point with a file in it is
// not mounted over (exit 4), and the refused create leaves no image, loop
// device or record.
func TestVolumeRefusesNonEmptyMountPoint(t *testing.T) {
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	mnt := filepath.Join(home, "volume")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "precious"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := p.run("volume", "create", "--size", "400M")
	if r.code != 4 || !strings.Contains(r.stderr, "not empty") {
		t.Fatalf("create over a non-empty dir: exit %d, want 4\n%s", r.code, r.stderr)
	}
	if mounted(t, mnt) {
		t.Fatalf("mounted over a non-empty directory")
	}
	for _, gone := range []string{filepath.Join(home, "volume.img"), filepath.Join(home, "volume.json")} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("refused create left %s", gone)
		}
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "precious")); err != nil || string(b) != "data" {
		t.Errorf("the directory's file was touched: %q %v", b, err)
	}
}

// TestVolumeFullThenGrow: when the volume fills, up exits 7 naming the
// volume and the grow command; the cluster made before is intact; after
// `volume grow` the same up succeeds.
func TestVolumeFullThenGrow(t *testing.T) {
	p := newTestPgfk(t)
	volumeHome(t, p)
	rec := createVolume(t, p, "320M")
	first := p.up("--name", "first", "--spares", "0")
	var st unix.Statfs_t
	if err := unix.Statfs(rec.Mount, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	fill := filepath.Join(rec.State, "fill")
	if err := unix.Fallocate(mustCreate(t, fill), 0, 0, free-8<<20); err != nil {
		t.Fatal(err)
	}
	r := p.run("up", "--name", "second", "--spares", "0", "--setup-cmd", "true")
	if r.code != 7 {
		t.Fatalf("up on a full volume: exit %d, want 7\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, rec.Image) || !strings.Contains(r.stderr, "pgfork volume grow --size") {
		t.Errorf("the error does not name the volume and how to grow it:\n%s", r.stderr)
	}
	if ls := p.run("ls"); !strings.Contains(ls.stdout, "first") || !strings.Contains(ls.stdout, "running") {
		t.Errorf("the cluster made before the volume filled is gone:\n%s", ls.stdout)
	}
	if _, err := os.Stat(filepath.Join(first.DataDir, "PG_VERSION")); err != nil {
		t.Errorf("first cluster's data: %v", err)
	}
	if g := p.run("volume", "grow", "--size", "1G"); g.code != 0 {
		t.Fatalf("volume grow: exit %d\n%s", g.code, g.stderr)
	}
	if err := unix.Statfs(rec.Mount, &st); err != nil || int64(st.Blocks)*st.Bsize < 900<<20 {
		t.Errorf("volume not grown: %d bytes (%v)", int64(st.Blocks)*st.Bsize, err)
	}
	if r := p.run("up", "--name", "second", "--spares", "0", "--setup-cmd", "true"); r.code != 0 {
		t.Errorf("up after grow: exit %d\n%s", r.code, r.stderr)
	}
}

func mustCreate(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// TestVolumeReattach: after the volume is unmounted and its loop device
// detached (a reboot), the next pgfork command run as root mounts it again
// and finds the clusters' data; without re-attaching nothing is written
// under the empty mount point.
func TestVolumeReattach(t *testing.T) {
	p := newTestPgfk(t)
	p.home = volumeHome(t, p)
	rec := createVolume(t, p, "400M")
	res := p.up("--name", "a", "--spares", "0")
	if r := p.run("down", "a"); r.code != 0 {
		t.Fatalf("down: %s", r.stderr)
	}
	if err := unix.Unmount(rec.Mount, 0); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "-d", loopOf(t, rec.Image)).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d: %v %s", err, out)
	}
	if mounted(t, rec.Mount) {
		t.Fatal("still mounted")
	}
	r := p.run("template", "ls")
	if r.code != 0 {
		t.Fatalf("template ls after unmount: exit %d\n%s", r.code, r.stderr)
	}
	if !mounted(t, rec.Mount) {
		t.Fatalf("the next command did not re-attach the volume\n%s", r.stderr)
	}
	if !strings.Contains(r.stdout, res.TemplateKey) {
		t.Errorf("template ls after re-attach does not show template %s:\n%s", res.TemplateKey, r.stdout)
	}
	if _, err := os.Stat(filepath.Join(rec.State, "templates")); err != nil {
		t.Errorf("the state on the volume is not back: %v", err)
	}
	// Explicit attach of an attached volume: a no-op, exit 0.
	if a := p.run("volume", "attach"); a.code != 0 {
		t.Errorf("volume attach: exit %d\n%s", a.code, a.stderr)
	}
}

// TestVolumeTwoProcesses: two pgfork up at once on one volume both get a
// cluster cloned from the one template on it.
func TestVolumeTwoProcesses(t *testing.T) {
	p := newTestPgfk(t)
	p.home = volumeHome(t, p)
	rec := createVolume(t, p, "600M")
	res, err := p.upsAtOnce(2, func(i int) []string { return []string{"--name", "c" + strconv.Itoa(i), "--spares", "0"} })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !strings.HasPrefix(r.DataDir, rec.State+"/") {
			t.Errorf("%s not on the volume", r.DataDir)
		}
		if dirShared(t, r.DataDir) == 0 {
			t.Errorf("%s shares no blocks: not cloned", r.DataDir)
		}
	}
}

// TestVolumeAuto: `up --volume auto` as root on ext4 with no volume creates
// one and puts the cluster on it; a second call reuses it.
func TestVolumeAuto(t *testing.T) {
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	if pr, err := clone.Probe(t.Context(), home, home); err != nil || pr.Clone {
		t.Skipf("the run directory can clone already (%v)", err)
	}
	for i := range 2 {
		res := p.up("--volume", "auto", "--spares", "0", "--name", "v"+strconv.Itoa(i))
		rec, err := volume.Load(home)
		if err != nil {
			t.Fatalf("no volume recorded after up --volume auto: %v", err)
		}
		if !strings.HasPrefix(res.DataDir, rec.State+"/") {
			t.Errorf("cluster %s not on the volume %s", res.DataDir, rec.State)
		}
	}
}

// TestDoctorMeasuresVolume: on ext4 doctor measures a copy there and a clone
// on a temporary volume, says how to create one, and leaves no image, loop
// device or mount behind.
func TestDoctorMeasuresVolume(t *testing.T) {
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	if pr, err := clone.Probe(t.Context(), home, home); err != nil || pr.Clone {
		t.Skipf("the run directory can clone already (%v)", err)
	}
	before, _ := exec.Command("losetup", "-a").Output()
	r := p.run("doctor", "--json", home)
	if r.code != 0 {
		t.Fatalf("doctor: exit %d\n%s", r.code, r.stderr)
	}
	var rep struct {
		Volume *struct {
			Speedup struct {
				Copy  float64 `json:"copy_ms"`
				Clone float64 `json:"clone_ms"`
				Why   string
			}
			Ratio   float64 `json:"speedup_ratio"`
			Command string
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	// Which is faster is a measurement (the bench's volume section), not
	// this test's: a fast disk under a loaded test run can copy 64 MiB as
	// quickly as a fresh loop volume clones it.
	if v := rep.Volume; v == nil || v.Speedup.Clone <= 0 || v.Speedup.Copy <= 0 || math.Abs(v.Ratio-v.Speedup.Copy/v.Speedup.Clone) > 0.01*v.Ratio {
		t.Fatalf("doctor did not measure and compare a copy and a clone:\n%s", r.stdout)
	}
	if !strings.Contains(rep.Volume.Command, "pgfork volume create") {
		t.Errorf("no command to create the volume: %q", rep.Volume.Command)
	}
	if after, _ := exec.Command("losetup", "-a").Output(); string(after) != string(before) {
		t.Errorf("doctor left loop devices:\n%s\nbefore:\n%s", after, before)
	}
	if m, _ := filepath.Glob(filepath.Join(home, ".pgfork-measure-*")); len(m) > 0 {
		t.Errorf("doctor left %v", m)
	}
}

// TestVolumeAdviceSaysWhatWasMeasured: doctor's advice gives the speed-up
// it measured, and says "no faster" when the clone was not clearly faster
// (rather than "1x faster").
func TestVolumeAdviceSaysWhatWasMeasured(t *testing.T) {
	for _, c := range []struct {
		copy, clone time.Duration
		want        string
	}{
		{74 * time.Millisecond, 88 * time.Millisecond, "0.84x: no faster at this size, now"},
		{74 * time.Millisecond, 2 * time.Millisecond, "(37x faster)"},
	} {
		sp := &volume.Speedup{Bytes: 64 << 20, Files: 16, Copy: c.copy, Clone: c.clone}
		var b strings.Builder
		printVolumeAdvice(&b, &volumeAdvice{Speedup: sp, Ratio: sp.Ratio(), Command: "pgfork volume create"}, "ext4")
		if out := b.String(); !strings.Contains(out, c.want) || !strings.Contains(out, "the fastest of 3 each") || !strings.Contains(out, "create it: pgfork volume create") {
			t.Errorf("copy %v, clone %v: want %q in\n%s", c.copy, c.clone, c.want, out)
		}
	}
}

// TestVolumeRefusesTooBig: an image larger than the free space is refused
// (exit 7) before anything is made.
func TestVolumeRefusesTooBig(t *testing.T) {
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	r := p.run("volume", "create", "--size", "4096T")
	if r.code != 7 || !strings.Contains(r.stderr, "would not fit") {
		t.Fatalf("create of a 4 PiB image: exit %d, want 7\n%s", r.code, r.stderr)
	}
	if ents, _ := os.ReadDir(home); len(ents) != 0 {
		t.Errorf("refused create left %d entries in %s", len(ents), home)
	}
}

// TestVolumeFlagValues: --volume (and PGFORK_VOLUME, which
// scripts/ci-setup.sh documents as "auto or none") takes none as "make no
// volume"; anything else but auto is a usage error naming both.
func TestVolumeFlagValues(t *testing.T) {
	cl := newCLI(streams{stdout: io.Discard, stderr: io.Discard, lookupEnv: os.LookupEnv})
	if err := cl.useVolume(context.Background(), "none"); err != nil {
		t.Errorf("--volume none: %v", err)
	}
	err := cl.useVolume(context.Background(), "bogus")
	if errs.KindOf(err) != errs.Usage || !strings.Contains(errs.HintOf(err), "auto or none") {
		t.Errorf("--volume bogus: %v (hint %q), want a usage error naming auto and none", err, errs.HintOf(err))
	}
}

// managedBuild returns the bin directory of a build that `pgfork pg
// install` made for the tests (<cache>/installs/<version>/bin), or skips.
func managedBuild(t *testing.T) string {
	t.Helper()
	for _, d := range testenv.PGBinDirs(t) {
		if filepath.Base(filepath.Dir(filepath.Dir(d))) == "installs" {
			return d
		}
	}
	if testenv.Require() {
		t.Fatal("no build of `pgfork pg install` among the test builds but PGFORK_TEST_REQUIRE=1")
	}
	t.Skip("no build of `pgfork pg install` among the test builds")
	return ""
}

// TestVolumeAutoRefusesWhileRunning (issue 32, F18): while a cluster of
// `pgfork up` runs, or a pgfork serve holds the state directory, `up
// --volume auto` and `volume create` refuse with exit 6, naming what runs
// and `pgfork down --all`, and move nothing: the cluster is still listed
// and can be brought down. Once nothing runs, the volume is made and the
// PostgreSQL build installed before (by `pgfork pg install`) and the
// template are carried over onto it: found there, gone from the old place.
func TestVolumeAutoRefusesWhileRunning(t *testing.T) {
	p := newTestPgfk(t)
	home := volumeHome(t, p)
	if pr, err := clone.Probe(t.Context(), home, home); err != nil || pr.Clone {
		t.Skipf("the run directory can clone already (%v)", err)
	}
	build := managedBuild(t)
	version := filepath.Base(filepath.Dir(build))
	major, _, _ := strings.Cut(version, ".")
	// As `pgfork pg install MAJOR` left it in this state directory.
	if err := os.MkdirAll(filepath.Join(home, "installs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", filepath.Dir(build), filepath.Join(home, "installs", version)).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	inHome := func(args ...string) cliResult { // no --pg-bin: pgfork finds its own builds
		t.Helper()
		return runInProcessEnv(t, nil, append([]string{"--state-dir", home}, args...)...)
	}
	a := p.up("--name", "a", "--spares", "0")

	for _, args := range [][]string{{"up", "--volume", "auto", "--name", "b", "--spares", "0"}, {"volume", "create", "--size", "600M"}} {
		r := p.run(args...)
		if r.code != 6 {
			t.Fatalf("%v with cluster a running: exit %d, want 6 (busy)\n%s", args, r.code, r.stderr)
		}
		t.Logf("%v refused: %s", args, r.stderr)
		for _, want := range []string{"cluster a (running)", "pgfork down --all"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("%v: the refusal does not say %q:\n%s", args, want, r.stderr)
			}
		}
	}
	if _, err := os.Lstat(filepath.Join(home, "volume.json")); !os.IsNotExist(err) {
		t.Fatalf("a refused create recorded a volume (%v)", err)
	}
	if mounted(t, filepath.Join(home, "volume")) {
		t.Fatal("a refused create left a volume mounted")
	}
	if es := p.ls(); len(es) != 1 || es[0].Name != "a" || es[0].State != "running" {
		t.Fatalf("after the refusals ls shows %+v, want cluster a running", es)
	}
	if r := p.run("down", "a"); r.code != 0 {
		t.Fatalf("down a after the refusals: exit %d\n%s", r.code, r.stderr)
	}
	if pidAlive(a.Pid) {
		t.Errorf("cluster a's server (pid %d) still runs after down", a.Pid)
	}

	// A pgfork serve holding the state directory (its lock) is named too.
	l, err := flock.TryExclusive(filepath.Join(home, "locks", "serve.lock"))
	if err != nil {
		t.Fatal(err)
	}
	if err := servelock.Record(statedir.Layout{Root: home}, "127.0.0.1:5999"); err != nil {
		t.Fatal(err)
	}
	r := p.run("up", "--volume", "auto", "--name", "b", "--spares", "0")
	l.Unlock()
	if r.code != 6 || !strings.Contains(r.stderr, fmt.Sprintf("pgfork serve (pid %d, listening on 127.0.0.1:5999)", os.Getpid())) || !strings.Contains(r.stderr, "stop pgfork serve") {
		t.Fatalf("up --volume auto with a serve on the state: exit %d, want 6 naming the serve\n%s", r.code, r.stderr)
	}
	if _, err := os.Lstat(filepath.Join(home, "volume.json")); !os.IsNotExist(err) {
		t.Fatalf("a refused create recorded a volume (%v)", err)
	}

	// Nothing runs: the volume is made, the build and the template go with the state.
	r = p.run("up", "--volume", "auto", "--name", "b", "--spares", "0", "--json")
	var b up.Result
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &b) != nil {
		t.Fatalf("up --volume auto once nothing runs: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("up --volume auto: %s", r.stderr)
	if !strings.Contains(r.stderr, "carrying PostgreSQL "+version+" over") {
		t.Errorf("up --volume auto does not say it carries PostgreSQL %s over:\n%s", version, r.stderr)
	}
	rec, err := volume.Load(home)
	if err != nil {
		t.Fatalf("no volume after up --volume auto: %v", err)
	}
	if !strings.HasPrefix(b.DataDir, rec.State+"/") {
		t.Errorf("cluster b %s is not on the volume %s", b.DataDir, rec.State)
	}
	if b.TemplateKey != a.TemplateKey || b.Built {
		t.Errorf("cluster b rebuilt its template (key %s, built %v): template %s was not carried over", b.TemplateKey, b.Built, a.TemplateKey)
	}
	for _, gone := range []string{filepath.Join(home, "installs", version), filepath.Join(home, "templates", a.TemplateKey)} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still in the old state directory (%v)", gone, err)
		}
	}
	ls := inHome("pg", "ls", "--json")
	var builds []struct {
		Version string `json:"version"`
		Bin     string `json:"bin_dir"`
	}
	if err := json.Unmarshal([]byte(ls.stdout), &builds); err != nil {
		t.Fatalf("pg ls --json: %v\n%s%s", err, ls.stdout, ls.stderr)
	}
	found := false
	for _, bd := range builds {
		found = found || bd.Version == version && bd.Bin == filepath.Join(rec.State, "installs", version, "bin")
	}
	if !found {
		t.Errorf("pg ls does not show PostgreSQL %s on the volume:\n%s", version, ls.stdout)
	}
	if r := inHome("--pg", major, "up", "--name", "c", "--spares", "0"); r.code != 0 {
		t.Errorf("up --pg %s with the carried-over build: exit %d\n%s", major, r.code, r.stderr)
	}
}
