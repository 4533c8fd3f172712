package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/testenv"
)

// TestVersion builds pgfork as `make build` does (version, commit and date
// through -ldflags) and as a plain `go build` does (the Go toolchain's build
// info), and checks that --version, `version` and `version --json` say what
// the binary is.
func TestVersion(t *testing.T) {
	dir := testenv.Dir(t)
	stamped := filepath.Join(dir, "pgfork-stamped")
	ld := "-X main.version=v9.8.7-test -X main.commit=0123456789abcdef0123 -X main.buildDate=2026-01-02T03:04:05Z"
	if out, err := exec.Command("go", "build", "-ldflags", ld, "-o", stamped, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	r := runCLI(t, exec.Command(stamped, "--version"))
	if r.code != 0 || !strings.Contains(r.stdout, "pgfork v9.8.7-test (commit 0123456789ab, built 2026-01-02T03:04:05Z") {
		t.Fatalf("pgfork --version: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, exec.Command(stamped, "version", "--json"))
	var v versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 {
		t.Fatalf("pgfork version --json: exit %d, %v: %q", r.code, err, r.stdout)
	}
	if v.Version != "v9.8.7-test" || v.Commit != "0123456789abcdef0123" || v.BuildDate != "2026-01-02T03:04:05Z" || v.Go == "" || v.Platform == "" {
		t.Fatalf("pgfork version --json = %+v", v)
	}

	// A plain build, as `go install` makes it (shared with TestEndToEndBinary).
	plain := plainBuild(t)
	r = runCLI(t, exec.Command(plain, "version"))
	if r.code != 0 || !strings.HasPrefix(r.stdout, "pgfork ") || strings.Contains(r.stdout, "v9.8.7") {
		t.Fatalf("pgfork version (plain build): exit %d, %q", r.code, r.stdout)
	}
	// In a git checkout the toolchain stamps the revision; not in a linked
	// worktree, whose .git is a file the go command does not recognize.
	if git, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil && gitDirIsDir(t) {
		if rev := strings.TrimSpace(string(git)); !strings.Contains(r.stdout, rev[:12]) {
			t.Errorf("plain build does not name the commit %s: %q", rev[:12], r.stdout)
		}
	}
}

// gitDirIsDir reports whether the checkout's .git is a directory (not the
// file of a linked worktree): only then does the go command stamp VCS
// information into a build.
func gitDirIsDir(t *testing.T) bool {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return false
	}
	fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git"))
	return err == nil && fi.IsDir()
}
