package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfork/pgfork/internal/testenv"
)

type cliResult struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, cmd *exec.Cmd) cliResult {
	t.Helper()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Env = append(os.Environ(), "PGFORK_HOME="+testenv.Dir(t))
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return cliResult{code, o.String(), e.String()}
}

func writeTree(t *testing.T, root string, files int, size int) {
	t.Helper()
	for i := range files {
		d := filepath.Join(root, "base", string(rune('a'+i%5)))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// Random bytes (nothing to compress or skip as holes), a stream
		// per file: filled by ChaCha8's Read, not a call per byte, which
		// under -race took most of TestCopyInterrupted's 240 MB.
		buf := make([]byte, size)
		var seed [32]byte
		seed[0], seed[1] = byte(i), byte(i>>8)
		_, _ = rand.NewChaCha8(seed).Read(buf)
		if err := os.WriteFile(filepath.Join(d, "f"+string(rune('A'+i%26))+string(rune('a'+i/26))), buf, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("base", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
}

func TestCopyCLI(t *testing.T) {
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	writeTree(t, src, 12, 10_000)

	// Flags after the arguments, JSON out.
	r := runInProcess(t, "copy", src, filepath.Join(base, "d1"), "--json", "--jobs", "2")
	if r.code != 0 {
		t.Fatalf("copy: exit %d: %s", r.code, r.stderr)
	}
	var res struct {
		Files, Dirs, Symlinks, Bytes int64
		Methods                      map[string]int64
		Sync                         string
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("bad JSON %q: %v", r.stdout, err)
	}
	if res.Files != 12 || res.Symlinks != 1 || res.Dirs != 7 || res.Bytes != 120_000 || res.Methods["copy-file-range"] != 12 || res.Sync != "fsync" {
		t.Errorf("JSON summary %+v", res)
	}
	// Flags before the arguments, human summary.
	r = runInProcess(t, "copy", "--method", "copy", "--sync", "none", src, filepath.Join(base, "d2"))
	if r.code != 0 || !strings.Contains(r.stdout, "copy 12") || !strings.Contains(r.stdout, "12 (7 directories, 1 symlinks)") {
		t.Errorf("copy --method copy: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	for _, c := range []struct {
		name string
		args []string
		code int
		want []string // in stderr
	}{
		{"dst exists", []string{"copy", src, filepath.Join(base, "d1")}, 4, []string{"d1", "already exists", "--force"}},
		{"src missing", []string{"copy", filepath.Join(base, "nope"), filepath.Join(base, "d3")}, 3, []string{"nope", "does not exist"}},
		{"src is a file", []string{"copy", filepath.Join(src, "base", "a", "fAa"), filepath.Join(base, "d3")}, 2, []string{"not a directory"}},
		{"one arg", []string{"copy", src}, 2, []string{"--help"}},
		{"bad method", []string{"copy", "--method", "teleport", src, filepath.Join(base, "d3")}, 2, []string{"teleport", "auto"}},
		{"bad sync", []string{"copy", "--sync", "maybe", src, filepath.Join(base, "d3")}, 2, []string{"maybe"}},
		{"bad jobs", []string{"copy", "--jobs", "-3", src, filepath.Join(base, "d3")}, 2, []string{"jobs"}},
		{"dst inside src", []string{"copy", src, filepath.Join(src, "inside")}, 2, []string{"inside the source"}},
		{"clone on ext4", []string{"copy", "--method", "clone", src, filepath.Join(base, "d3")}, 5, []string{"ext4", "clone", "--method auto"}},
		{"doctor missing dir", []string{"doctor", filepath.Join(base, "nope")}, 3, []string{"nope"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runInProcess(t, c.args...)
			if r.code != c.code {
				t.Errorf("exit %d, want %d; stderr: %s", r.code, c.code, r.stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr should mention %q: %s", w, r.stderr)
				}
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(base, "d3")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed copy left d3 behind")
	}
	// --force replaces.
	r = runInProcess(t, "copy", src, filepath.Join(base, "d1"), "--force", "-q")
	if r.code != 0 || r.stderr != "" {
		t.Errorf("--force: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, args := range [][]string{{"copy", "--help"}, {"doctor", "--help"}} {
		r = runInProcess(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Examples:") {
			t.Errorf("%v: exit %d, no examples:\n%s", args, r.code, r.stdout)
		}
	}
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("leftover %s", e.Name())
		}
	}
}

func TestCopyCLIPermission(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run pgfork as another user")
	}
	bin := pgforkBinary(t) // runs as another user
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	writeTree(t, src, 3, 100)
	_ = os.Chmod(filepath.Join(src, "empty"), 0o755)
	secret := filepath.Join(src, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "out")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(out, 0o777)
	cmd := exec.Command(bin, "copy", src, filepath.Join(out, "dst"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	r := runCLI(t, cmd)
	if r.code != 8 || !strings.Contains(r.stderr, "secret") || !strings.Contains(r.stderr, "permission denied") || !strings.Contains(r.stderr, "hint:") {
		t.Errorf("unreadable source file: exit %d (want 8), stderr: %s", r.code, r.stderr)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

func TestDoctorCLI(t *testing.T) {
	for _, c := range []struct {
		dir   func(testing.TB) string
		fs    string
		use   string
		share bool
	}{
		{testenv.Dir, "ext4", "copy-file-range", false},
		{testenv.XFSDir, "xfs", "clone", true},
	} {
		d := c.dir(t)
		r := runInProcess(t, "doctor", d, "--json")
		var rep struct {
			PostgreSQL []struct{ Major int } `json:"postgresql"`
			Probe      struct {
				FSType       string `json:"fs_type"`
				SharesBlocks bool   `json:"shares_blocks"`
			}
			WillUse string `json:"will_use"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 0 {
			t.Fatalf("doctor: exit %d, %v: %s %s", r.code, err, r.stdout, r.stderr)
		}
		if rep.Probe.FSType != c.fs || rep.WillUse != c.use || rep.Probe.SharesBlocks != c.share {
			t.Errorf("doctor %s: %+v", d, rep)
		}
		if len(testenv.PGBinDirs(t)) > 0 && len(rep.PostgreSQL) == 0 {
			t.Errorf("doctor found no PostgreSQL")
		}
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("doctor left probe files in %s", d)
		}
	}
	// Default DIR: the state dir, created.
	home := filepath.Join(testenv.Dir(t), "state")
	r := runInProcess(t, "doctor", "--state-dir", home)
	if r.code != 0 || !strings.Contains(r.stdout, "pgfork will use") || !strings.Contains(r.stdout, home) {
		t.Errorf("doctor: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// stagingDirs lists the staging directories of copies to dst.
func stagingDirs(t *testing.T, dst string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".pgfork-staging-*"))
	return m
}

// startCopyAndWait starts a slow copy and returns once its staging dir holds
// some files.
func startCopyAndWait(t *testing.T, bin, src, dst string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "copy", "--method", "copy", "--jobs", "1", "--sync", "fsync", src, dst)
	cmd.Env = append(os.Environ(), "PGFORK_HOME="+testenv.Dir(t))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A deadline no load reaches: a process of its own starts the copy.
	deadline := time.Now().Add(testenv.WaitTimeout)
	for time.Now().Before(deadline) {
		for _, s := range stagingDirs(t, dst) {
			if m, _ := filepath.Glob(filepath.Join(s, "base", "*", "f*")); len(m) >= 2 {
				return cmd
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	t.Fatal("the copy never started filling its staging directory")
	return nil
}

// TestCopyInterrupted kills pgfork mid-copy (kill -9, then Ctrl-C): DST never
// appears half-built, and the next run cleans the leftovers and succeeds.
func TestCopyInterrupted(t *testing.T) {
	bin := pgforkBinary(t) // signalled
	base := testenv.Dir(t)
	src := filepath.Join(base, "src")
	writeTree(t, src, 60, 4<<20)
	dst := filepath.Join(base, "dst")

	cmd := startCopyAndWait(t, bin, src, dst)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("DST exists after kill -9")
	}
	if len(stagingDirs(t, dst)) != 1 {
		t.Fatalf("expected the killed copy's staging dir to remain, found %v", stagingDirs(t, dst))
	}

	// Ctrl-C: the copy removes its staging dir itself and exits 130.
	dstInt := filepath.Join(base, "dst-int")
	cmd = startCopyAndWait(t, bin, src, dstInt)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("Ctrl-C: want exit 130, got %v", err)
	}
	if _, err := os.Lstat(dstInt); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("DST exists after Ctrl-C")
	}
	if s := stagingDirs(t, dstInt); len(s) != 0 {
		t.Errorf("Ctrl-C left its staging dir: %v", s)
	}

	r := runInProcess(t, "copy", src, dst, "--json")
	if r.code != 0 {
		t.Fatalf("second run: exit %d: %s", r.code, r.stderr)
	}
	if s := stagingDirs(t, dst); len(s) != 0 {
		t.Errorf("leftover staging dirs after the second run: %v", s)
	}
	m, _ := filepath.Glob(filepath.Join(dst, "base", "*", "f*"))
	if len(m) != 60 {
		t.Errorf("second run copied %d files, want 60", len(m))
	}
}
