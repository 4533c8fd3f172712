package clone

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/fsutil"
)

const (
	stagingTag = ".pgfork-staging-"
	oldTag     = ".pgfork-old-"
)

// replace swaps the finished staging dir with the existing dst and removes
// the old one: atomically with RENAME_EXCHANGE, else by renaming it aside.
func replace(staging, dst string) error {
	ok, err := fsutil.Exchange(staging, dst)
	if err != nil {
		return err
	}
	if ok { // staging now holds the old dst
		return fsutil.RemoveAll(staging)
	}
	aside := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+oldTag+fmt.Sprint(os.Getpid())+"-"+fsutil.RandomTag())
	if err := os.Rename(dst, aside); err != nil {
		return err
	}
	if err := os.Rename(staging, dst); err != nil {
		_ = os.Rename(aside, dst)
		return err
	}
	return fsutil.RemoveAll(aside)
}

// CleanStale removes what earlier copies to dst left behind when they
// crashed or were killed: staging directories (and replaced old copies)
// beside dst whose process is gone. Staging directories of copies still
// running are left alone.
func CleanStale(dst string) error {
	dst, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	parent, base := filepath.Dir(dst), filepath.Base(dst)
	ents, err := os.ReadDir(parent)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	var all []error
	for _, e := range ents {
		name := e.Name()
		var rest string
		switch {
		case strings.HasPrefix(name, "."+base+stagingTag):
			rest = strings.TrimPrefix(name, "."+base+stagingTag)
		case strings.HasPrefix(name, "."+base+oldTag):
			rest = strings.TrimPrefix(name, "."+base+oldTag)
		default:
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		var pid int
		if _, err := fmt.Sscanf(pidStr, "%d", &pid); !ok || err != nil || pid <= 0 {
			continue
		}
		p := filepath.Join(parent, name)
		if (pidAlive(pid) && flock.IsLockedByLiveProcess(p)) || (pid == os.Getpid() && strings.Contains(name, oldTag)) {
			continue
		}
		if err := fsutil.RemoveAll(p); err != nil {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// checkSrc resolves src and checks it is a readable directory.
func checkSrc(src string) (string, error) {
	if src == "" {
		return "", errs.New(errs.Usage, "empty source path").WithHint("give the directory to copy")
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", errs.Wrap(errs.Usage, err, "bad source path").WithPath(src)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", errs.New(errs.NotFound, "source directory does not exist").WithPath(abs).
				WithHint("check the path")
		}
		return "", errs.FromOS(err, abs, "cannot read the source")
	}
	if !fi.IsDir() {
		return "", errs.New(errs.Usage, "source is not a directory").WithPath(abs).
			WithHint("give a directory; a single file is copied with cp")
	}
	return abs, nil
}

// checkPaths validates src and dst for Copy.
func checkPaths(src, dst string, force bool) (srcAbs, dstAbs string, dstExists bool, err error) {
	srcAbs, err = checkSrc(src)
	if err != nil {
		return
	}
	if dst == "" {
		return "", "", false, errs.New(errs.Usage, "empty destination path").WithHint("give the directory to create")
	}
	dstAbs, err = filepath.Abs(dst)
	if err != nil {
		return "", "", false, errs.Wrap(errs.Usage, err, "bad destination path").WithPath(dst)
	}
	if b := filepath.Base(dstAbs); b == "/" || b == "." || b == ".." {
		return "", "", false, errs.New(errs.Usage, "destination cannot be a filesystem root").WithPath(dstAbs).
			WithHint("name a new directory to create")
	}
	parent := filepath.Dir(dstAbs)
	pfi, perr := os.Stat(parent)
	if perr != nil {
		if errors.Is(perr, fs.ErrNotExist) {
			return "", "", false, errs.New(errs.NotFound, "the destination's parent directory does not exist").WithPath(parent).
				WithHint("create it first: mkdir -p %s", parent)
		}
		return "", "", false, errs.FromOS(perr, parent, "cannot use the destination's parent directory")
	}
	if !pfi.IsDir() {
		return "", "", false, errs.New(errs.Usage, "the destination's parent is not a directory").WithPath(parent).
			WithHint("choose a destination inside a directory")
	}
	if _, lerr := os.Lstat(dstAbs); lerr == nil {
		dstExists = true
		if !force {
			return "", "", false, errs.New(errs.Exists, "destination already exists").WithPath(dstAbs).
				WithHint("choose another destination, or ask for it to be replaced").WithCLI("pass --force to replace it")
		}
	}
	if err = checkNesting(srcAbs, dstAbs, force); err != nil {
		return
	}
	return srcAbs, dstAbs, dstExists, nil
}

// checkNesting refuses a dst inside src (the copy would copy itself and
// write the source) and, with force, a src inside dst (replacing dst would
// delete the source).
func checkNesting(srcAbs, dstAbs string, force bool) error {
	realSrc, err := filepath.EvalSymlinks(srcAbs)
	if err != nil {
		realSrc = srcAbs
	}
	realDst := dstAbs
	if p, err := filepath.EvalSymlinks(filepath.Dir(dstAbs)); err == nil {
		realDst = filepath.Join(p, filepath.Base(dstAbs))
	}
	if fsutil.Within(realDst, realSrc) {
		return errs.New(errs.Usage, "destination %s is inside the source %s", dstAbs, srcAbs).
			WithHint("copy to a directory outside the source")
	}
	if force && fsutil.Within(realSrc, realDst) {
		return errs.New(errs.Usage, "the source %s is inside the destination %s: replacing it would delete the source", srcAbs, dstAbs).
			WithHint("choose a destination that does not contain the source")
	}
	return nil
}

func emptyDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		_ = fsutil.RemoveAll(filepath.Join(dir, e.Name()))
	}
}
