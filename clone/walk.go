package clone

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/pgfork/pgfork/internal/errs"
)

type kind int

const (
	kDir kind = iota
	kFile
	kSymlink
	kFifo
)

// setDirsMeta gives the copied directories their metadata, children before
// parents (so their mtimes stick), once every entry is in place.
func (c *copier) setDirsMeta() error {
	for i := len(c.dirs) - 1; i >= 0; i-- {
		d := c.dirs[i]
		if i == 0 && c.opts.KeepRootPrivate {
			continue // handed over last (rootMeta / HandOver)
		}
		if err := c.setMeta(nil, c.dstPath(d), d); err != nil {
			return err
		}
	}
	return nil
}

// rootMeta gives the destination directory itself its final metadata, by
// descriptor (HandOver), once nothing more is written into it.
func (c *copier) rootMeta() error {
	d := c.dirs[0]
	uid, gid := -1, -1
	if c.opts.Owner != nil {
		uid, gid = c.opts.Owner.UID, c.opts.Owner.GID
	} else if c.isRoot && d.sys.ok {
		uid, gid = d.sys.uid, d.sys.gid
	}
	if err := HandOver(c.root, uid, gid, d.mode&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return c.writeErr(err, d)
	}
	if c.opts.SkipTimes {
		return nil
	}
	return lutimes(c.root, d.atime, d.mtime)
}

// walk lists the source tree, applying the filter.
func (c *copier) walk(ctx context.Context) error {
	fi, err := os.Lstat(c.src)
	if err != nil {
		return errs.FromOS(err, c.src, "cannot read the source")
	}
	if !fi.IsDir() { // src given as a symlink to a directory
		if fi, err = os.Stat(c.src); err != nil {
			return errs.FromOS(err, c.src, "cannot read the source")
		}
	}
	c.dirs = append(c.dirs, newEntry("", kDir, fi))
	return c.walkDir(ctx, "")
}

func newEntry(rel string, k kind, fi fs.FileInfo) *entry {
	si := statOf(fi)
	at := si.atime
	if at.IsZero() {
		at = fi.ModTime()
	}
	return &entry{rel: rel, kind: k, mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime(), atime: at, sys: si}
}

func (c *copier) walkDir(ctx context.Context, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	abs := filepath.Join(c.src, filepath.FromSlash(rel))
	ents, err := os.ReadDir(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished && rel != "" {
			return nil
		}
		return errs.FromOS(err, abs, "cannot list the source directory")
	}
	for _, d := range ents {
		r := path.Join(rel, d.Name())
		act := Include
		if c.opts.Filter != nil {
			act = c.opts.Filter(r, d)
		}
		if act == Skip {
			continue
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished {
				c.vanished64.Add(1)
				continue
			}
			return c.readErr(err, filepath.Join(abs, d.Name()))
		}
		switch m := fi.Mode(); {
		case m.IsDir():
			c.dirs = append(c.dirs, newEntry(r, kDir, fi))
			if act != EmptyDir {
				if err := c.walkDir(ctx, r); err != nil {
					return err
				}
			}
		case m.IsRegular():
			e := newEntry(r, kFile, fi)
			c.files = append(c.files, e)
			c.totalBytes += e.size
			c.needBytes += e.sys.blocks * 512
		case m&fs.ModeSymlink != 0:
			e := newEntry(r, kSymlink, fi)
			t, err := os.Readlink(filepath.Join(abs, d.Name()))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) && c.opts.TolerateVanished {
					c.vanished64.Add(1)
					continue
				}
				return c.readErr(err, filepath.Join(abs, d.Name()))
			}
			e.target = t
			c.others = append(c.others, e)
		case m&fs.ModeNamedPipe != 0:
			c.others = append(c.others, newEntry(r, kFifo, fi))
		case m&fs.ModeSocket != 0:
			// A socket is meaningless without its server; leave it out.
		default:
			return errs.New(errs.Unsupported, "cannot copy special file (%s)", m.Type()).
				WithPath(filepath.Join(abs, d.Name())).
				WithHint("remove it from the source or skip it with a filter")
		}
	}
	return nil
}

func (c *copier) makeOther(e *entry) error {
	p := c.dstPath(e)
	switch e.kind {
	case kSymlink:
		if err := os.Symlink(e.target, p); err != nil {
			return c.writeErr(err, e)
		}
	case kFifo:
		if err := mkfifo(p, e.mode); err != nil {
			return c.writeErr(err, e)
		}
	}
	return c.setMeta(nil, p, e)
}

// setMeta gives the copy at p the ownership, mode and times of e (not
// the times with SkipTimes). f, when
// not nil, is p just created by this copy (with createPerm) and opened for
// writing: a stat of it (no journal transaction) tells whether its owner
// and mode are already right, so that the chown and chmod (a transaction
// each on a journaling filesystem, most of the time of a reflink copy of
// small files) run only when they change something.
func (c *copier) setMeta(f *os.File, p string, e *entry) error {
	uid, gid, chown := -1, -1, false
	if c.opts.Owner != nil {
		uid, gid, chown = c.opts.Owner.UID, c.opts.Owner.GID, true
	} else if c.isRoot && e.sys.ok {
		uid, gid, chown = e.sys.uid, e.sys.gid, true
	}
	mode := e.mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	chmod := e.kind != kSymlink
	if f != nil {
		if fi, err := f.Stat(); err == nil {
			if st := statOf(fi); st.ok && st.uid == uid && st.gid == gid {
				chown = false
			}
			// A chown clears the set-id bits, so those always need a chmod.
			chmod = fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != mode ||
				mode&(fs.ModeSetuid|fs.ModeSetgid) != 0
		}
	}
	if chown {
		var err error
		if f != nil {
			err = f.Chown(uid, gid)
		} else {
			err = os.Lchown(p, uid, gid)
		}
		if err != nil {
			return c.writeErr(err, e)
		}
	}
	if chmod {
		var err error
		if f != nil {
			err = f.Chmod(mode)
		} else {
			err = os.Chmod(p, mode)
		}
		if err != nil {
			return c.writeErr(err, e)
		}
	}
	if c.opts.SkipTimes {
		return nil
	}
	if err := lutimes(p, e.atime, e.mtime); err != nil {
		return c.writeErr(err, e)
	}
	return nil
}

// createPerm is the mode a copied file is created with: the owner's bits
// of its final mode, so that no one else can open it before its owner is
// set, and a file that is private in the source (PostgreSQL's 0600) needs
// no chmod afterwards.
func createPerm(e *entry) os.FileMode { return e.mode.Perm() & 0o700 }
