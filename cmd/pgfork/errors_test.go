package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestExitCodeOfEachKind drives every error kind, as the OS classifier
// produces it from a real errno (or as library code builds it), to the exit
// code the help text documents.
func TestExitCodeOfEachKind(t *testing.T) {
	osErr := func(e error) error {
		return errs.FromOS(&fs.PathError{Op: "mkdir", Path: "/x", Err: e}, "/x", "cannot create")
	}
	for _, c := range []struct {
		err  error
		code int
	}{
		{errs.New(errs.Internal, "boom"), exitError},
		{osErr(syscall.EIO), exitError},
		{errs.New(errs.Usage, "bad flag"), exitUsage},
		{osErr(syscall.ENOENT), exitNotFound},
		{osErr(syscall.EEXIST), exitExists},
		{osErr(syscall.ENOTEMPTY), exitExists},
		{osErr(syscall.EXDEV), exitUnsupported},
		{osErr(syscall.EOPNOTSUPP), exitUnsupported},
		{osErr(syscall.EBUSY), exitBusy},
		{osErr(syscall.ENOSPC), exitNoSpace},
		{osErr(syscall.EDQUOT), exitNoSpace},
		{osErr(syscall.EACCES), exitPermission},
		{osErr(syscall.EPERM), exitPermission},
		{osErr(syscall.EROFS), exitPermission},
		{errs.FromOS(fmt.Errorf("walk: %w", context.Canceled), "/x", "copy"), exitInterrupted},
		{fmt.Errorf("untyped: %w", context.Canceled), exitInterrupted},
	} {
		if got := exitCode(c.err); got != c.code {
			t.Errorf("exitCode(%v) [%s] = %d, want %d", c.err, errs.KindOf(c.err), got, c.code)
		}
	}
	// Every code is in the help text.
	for _, code := range []int{exitError, exitUsage, exitNotFound, exitExists, exitUnsupported, exitBusy, exitNoSpace, exitPermission, exitInterrupted} {
		if !strings.Contains(exitCodesHelp, fmt.Sprintf("\n  %-4d ", code)) {
			t.Errorf("exit code %d is not in the help text", code)
		}
	}
}

// fullFS mounts a tmpfs that has no inode left, so the first mkdir in it
// fails with ENOSPC, as on a full disk.
func fullFS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if testenv.Require() {
			t.Fatal("mounting a full filesystem needs root")
		}
		t.Skip("mounting a full filesystem needs root")
	}
	dir := filepath.Join(testenv.Dir(t), "full")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=1,mode=0777", "pgfork-test-full", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// TestFullDiskDuringMkdirAllExitsNoSpace: creating the state directory on a
// full filesystem is "out of disk space" (7), not "permission denied" (8).
func TestFullDiskDuringMkdirAllExitsNoSpace(t *testing.T) {
	state := filepath.Join(fullFS(t), "state")
	r := runInProcess(t, "doctor", "--state-dir", state)
	if r.code != exitNoSpace || !strings.Contains(r.stderr, "no space left") || !strings.Contains(r.stderr, "hint:") {
		t.Errorf("doctor on a full filesystem: exit %d (want %d), stderr %q", r.code, exitNoSpace, r.stderr)
	}
}
