package errs_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
)

// TestFromOSRealErrors classifies errors the kernel really returns.
func TestFromOSRealErrors(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	if err := os.MkdirAll(filepath.Join(full, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, enoent := os.Open(filepath.Join(dir, "missing"))
	eexist := os.Mkdir(full, 0o755)
	enotempty := os.Remove(full)
	_, eisdir := os.ReadFile(full)
	for _, c := range []struct {
		err  error
		kind errs.Kind
	}{
		{enoent, errs.NotFound},
		{eexist, errs.Exists},
		{enotempty, errs.Exists},
		{eisdir, errs.Internal},
	} {
		got := errs.FromOS(c.err, "obj", "cannot do it")
		if errs.KindOf(got) != c.kind {
			t.Errorf("FromOS(%v): kind %s, want %s", c.err, errs.KindOf(got), c.kind)
		}
		if !errors.Is(got, c.err.(*fs.PathError).Err) {
			t.Errorf("FromOS(%v) lost its cause: %v", c.err, got)
		}
		// The path is named once: by the typed error, not again by the OS error.
		if s := got.Error(); strings.Count(s, dir) != 0 || !strings.HasPrefix(s, "obj: cannot do it: ") {
			t.Errorf("FromOS(%v) = %q", c.err, s)
		}
	}
}

// TestFromOSTable covers every errno of the classifier's table, bare and
// wrapped the ways the os package wraps them.
func TestFromOSTable(t *testing.T) {
	for _, c := range []struct {
		err  error
		kind errs.Kind
	}{
		{syscall.ENOSPC, errs.NoSpace},
		{syscall.EDQUOT, errs.NoSpace},
		{syscall.EACCES, errs.Permission},
		{syscall.EPERM, errs.Permission},
		{syscall.EROFS, errs.Permission},
		{syscall.ENOENT, errs.NotFound},
		{syscall.EEXIST, errs.Exists},
		{syscall.ENOTEMPTY, errs.Exists},
		{syscall.EBUSY, errs.Busy},
		{syscall.EXDEV, errs.Unsupported},
		{syscall.EOPNOTSUPP, errs.Unsupported},
		{syscall.EIO, errs.Internal},
		{context.Canceled, errs.Interrupted},
		{fmt.Errorf("copying: %w", context.Canceled), errs.Interrupted},
	} {
		for _, err := range []error{
			c.err,
			&fs.PathError{Op: "mkdir", Path: "/x", Err: c.err},
			&os.LinkError{Op: "rename", Old: "/a", New: "/b", Err: c.err},
			os.NewSyscallError("fsync", c.err),
		} {
			got := errs.FromOS(err, "/x", "cannot %s", "work")
			if k := errs.KindOf(got); k != c.kind {
				t.Errorf("FromOS(%#v): %s, want %s", err, k, c.kind)
			}
			if errs.OSKind(err) != c.kind {
				t.Errorf("OSKind(%#v): %s, want %s", err, errs.OSKind(err), c.kind)
			}
			if (c.kind == errs.NoSpace || c.kind == errs.Permission) && errs.HintOf(got) == "" {
				t.Errorf("FromOS(%v): no hint", err)
			}
			if h := errs.HintOf(got); strings.Contains(h, "pgfork ") && !strings.HasPrefix(h, "run pgfork") {
				t.Errorf("FromOS(%v): hint names a command: %q", err, h)
			}
		}
	}
}

func TestFromOSWithoutObjectKeepsThePath(t *testing.T) {
	err := errs.FromOS(&fs.PathError{Op: "open", Path: "/data/base/1", Err: syscall.EIO}, "", "cannot list")
	if err.Error() != "cannot list: open /data/base/1: input/output error" {
		t.Errorf("got %q", err)
	}
}

func TestFromOSKeepsTypedAndNil(t *testing.T) {
	if err := errs.FromOS(nil, "x", "y"); err != nil {
		t.Fatalf("FromOS(nil) = %#v, want an untyped nil", err)
	}
	typed := errs.New(errs.Busy, "held").WithHint("wait")
	wrapped := fmt.Errorf("outer: %w", typed)
	if got := errs.FromOS(wrapped, "x", "y"); got != wrapped || errs.KindOf(got) != errs.Busy {
		t.Errorf("FromOS of a typed error: %v (%s)", got, errs.KindOf(got))
	}
}

// TestWrapNeverTypedNil: a nil *Error in an error interface is not nil; Wrap
// must never produce one.
func TestWrapNeverTypedNil(t *testing.T) {
	f := func() error { return errs.Wrap(errs.Internal, nil, "closing %s", "x") }
	err := f()
	if err == nil {
		t.Fatal("Wrap(nil) returned nil")
	}
	if err.Error() != "closing x" || errs.KindOf(err) != errs.Internal {
		t.Errorf("Wrap(nil) = %q (%s)", err, errs.KindOf(err))
	}
}

func TestCLIHintKeptApart(t *testing.T) {
	e := errs.New(errs.NotFound, "no cluster named %q", "a").WithHint("list the clusters").WithCLI("see `pgfork ls`")
	err := fmt.Errorf("down: %w", e)
	if errs.HintOf(err) != "list the clusters" || errs.CLIHintOf(err) != "see `pgfork ls`" {
		t.Errorf("hint %q, CLI %q", errs.HintOf(err), errs.CLIHintOf(err))
	}
}

// TestKindThroughWrapping: an errs.Internal wrapper keeps the kind of what it
// wraps (a *Error or an OS error), and the errs.Is helpers ask by behaviour.
func TestKindThroughWrapping(t *testing.T) {
	busy := errs.New(errs.Busy, "template in use")
	wrapped := errs.Wrap(errs.Internal, fmt.Errorf("step: %w", busy), "cannot create")
	if errs.KindOf(wrapped) != errs.Busy || !errs.IsBusy(wrapped) || errs.IsNotFound(wrapped) {
		t.Fatalf("errs.KindOf(errs.Internal wrapping errs.Busy) = %v, want busy", errs.KindOf(wrapped))
	}
	if got := errs.KindOf(errs.Wrap(errs.Usage, busy, "outer")); got != errs.Usage {
		t.Fatalf("an outer kind other than errs.Internal wins: got %v", got)
	}
	full := errs.Wrap(errs.Internal, &fs.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, "cannot write")
	if errs.KindOf(full) != errs.Internal {
		t.Fatalf("errs.KindOf does not classify OS errors: got %v", errs.KindOf(full))
	}
	classified := errs.FromOS(full, "/x", "cannot copy")
	if !errs.IsNoSpace(classified) || !strings.Contains(classified.Error(), "cannot write") {
		t.Fatalf("errs.FromOS(errs.Internal wrapping ENOSPC) = %v (%v), want no-space keeping the inner message", classified, errs.KindOf(classified))
	}
	if errs.OSKind(full) != errs.NoSpace {
		t.Fatalf("errs.OSKind(errs.Internal wrapping ENOSPC) = %v", errs.OSKind(full))
	}
	if errs.Is(nil, errs.Internal) || errs.IsNoSpace(nil) {
		t.Fatal("nil is no kind")
	}
}
