package server_test

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pool"
	"github.com/pgfork/pgfork/server"
)

// TestStatusOfEachKind drives every error kind (as the OS classifier and the
// pool produce them) to the HTTP status the server answers with.
func TestStatusOfEachKind(t *testing.T) {
	osErr := func(e error) error {
		return errs.FromOS(&fs.PathError{Op: "mkdir", Path: "/x", Err: e}, "/x", "cannot create")
	}
	for _, c := range []struct {
		err    error
		status int
	}{
		{errs.New(errs.Internal, "boom"), http.StatusInternalServerError},
		{osErr(syscall.EIO), http.StatusInternalServerError},
		{errs.New(errs.Usage, "bad hash"), http.StatusBadRequest},
		{osErr(syscall.ENOENT), http.StatusNotFound},
		{osErr(syscall.EEXIST), http.StatusLocked},
		{osErr(syscall.EXDEV), http.StatusInternalServerError},
		{osErr(syscall.EBUSY), http.StatusServiceUnavailable},
		{osErr(syscall.ENOSPC), http.StatusInsufficientStorage},
		{osErr(syscall.EACCES), http.StatusInternalServerError},
		{errs.FromOS(fmt.Errorf("x: %w", context.Canceled), "", "create"), http.StatusServiceUnavailable},
		{errs.Wrap(errs.NotFound, pool.ErrTemplateDiscarded, "template h"), http.StatusGone},
		{errs.Wrap(errs.Exists, pool.ErrTemplateExists, "template h"), http.StatusLocked},
		{errs.Wrap(errs.Busy, pool.ErrTimeout, "template h"), http.StatusServiceUnavailable},
	} {
		if got := server.StatusOf(c.err); got != c.status {
			t.Errorf("StatusOf(%v) [%s] = %d, want %d", c.err, errs.KindOf(c.err), got, c.status)
		}
	}
}
