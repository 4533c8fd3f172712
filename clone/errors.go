package clone

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/pgfork/pgfork/internal/errs"
)

func (c *copier) readErr(err error, p string) error {
	if errors.Is(err, fs.ErrNotExist) {
		return errs.Wrap(errs.NotFound, err, "source file vanished during the copy").WithPath(p).
			WithHint("stop whatever is changing the source, or copy a running server with pgfork's online clone")
	}
	return errs.FromOS(err, p, "cannot read")
}

func (c *copier) writeErr(err error, e *entry) error {
	return errs.FromOS(err, c.finalPath(e), "cannot write")
}

func (c *copier) unsupported(m Method, f *entry, cause error) error {
	dstFS, _ := FSType(c.root)
	srcFS, _ := FSType(c.src)
	what := map[Method]string{Clone: "clone (reflink)", CopyFileRange: "copy_file_range", Link: "hard-link"}[m]
	var msg string
	if srcFS == dstFS && f.sys.dev == c.dstDev {
		msg = fmt.Sprintf("the %s filesystem at %s cannot %s files", dstFS, filepath.Dir(c.final), what)
	} else {
		msg = fmt.Sprintf("cannot %s files from the %s filesystem of %s to the %s filesystem of %s", what, srcFS, c.src, dstFS, filepath.Dir(c.final))
	}
	return errs.Wrap(errs.Unsupported, cause, "%s (tried on %s)", msg, f.rel).
		WithHint("use the automatic method, which picks the best one that works here").WithCLI("--method auto")
}

type noSpaceError struct {
	rel string
	err error
}

func (e *noSpaceError) Error() string { return e.rel + ": " + e.err.Error() }

func (e *noSpaceError) Unwrap() error { return e.err }

// finalError turns a failed run's error into what the user sees, after the
// partial copy has been removed (so the free space reported is real).
func (c *copier) finalError(ctx context.Context, err error, spaceDir string) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errs.KindOf(err) == errs.Internal) {
		return errs.Wrap(errs.Interrupted, ctx.Err(), "copy to %s interrupted; nothing was left behind", c.final).
			WithHint("run it again")
	}
	if IsNoSpace(err) {
		return NoSpaceError(err, spaceDir, c.final, c.needBytes)
	}
	return err
}
