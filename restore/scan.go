package restore

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/pgbackup"
)

// What the planner reads of the backups: the newest one's tree (scan) and
// the older versions of a file (lookup), read without following links.

// scan lists the newest backup of the chain: its directories and files,
// INCREMENTAL files with their headers read. Anything but files and
// directories is refused: pg_basebackup writes none (tablespaces are
// refused before) and restore must not hide what it did not rebuild.
func scan(chain pgbackup.Chain, newest *safefs.Dir) ([]Node, error) {
	top := chain.Newest().Dir
	var tree []Node
	err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return errs.FromOS(err, p, "cannot read the backup")
		}
		rel, _ := filepath.Rel(top, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return errs.FromOS(err, p, "cannot read the backup")
		}
		if d.IsDir() {
			tree = append(tree, Node{Rel: rel, Dir: true, Mode: fi.Mode().Perm()})
			return nil
		}
		if !d.Type().IsRegular() {
			return errs.New(errs.Usage, "the backup holds %s where pg_basebackup writes only files and directories", safefs.TypeName(d.Type())).
				WithPath(p).WithHint("remove it or take a new backup; the backup's own manifest does not list it")
		}
		nd := Node{Rel: rel, Mode: fi.Mode().Perm(), Entry: Entry{Kind: Full, Path: rel, Size: fi.Size()}}
		dir, name := filepath.ToSlash(filepath.Dir(rel)), d.Name()
		if pgbackup.IsIncrementalDir(dir) && strings.HasPrefix(name, pgbackup.IncrementalPrefix) {
			nd.Rel = dir + "/" + strings.TrimPrefix(name, pgbackup.IncrementalPrefix)
			nd.Kind, nd.Size = Incr, 0
			if nd.Inc, err = readHeader(newest, rel, p); err != nil {
				return err
			}
		}
		tree = append(tree, nd)
		return nil
	})
	return tree, err
}

// lookup is the planner's Lookup over the backups' directories: the file
// itself in backup k, else its INCREMENTAL file, else Absent.
func lookup(chain pgbackup.Chain, src []*safefs.Dir) Lookup {
	return func(k int, rel string) (Entry, error) {
		dir := chain[k].Dir
		f, err := src[k].OpenRegular(rel)
		if err == nil {
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return Entry{}, errs.FromOS(err, f.Name(), "cannot read the backup")
			}
			return Entry{Kind: Full, Path: rel, Size: fi.Size()}, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return Entry{}, readErr(err, filepath.Join(dir, filepath.FromSlash(rel)))
		}
		d, base := filepath.ToSlash(filepath.Dir(rel)), filepath.Base(rel)
		inc := d + "/" + pgbackup.IncrementalPrefix + base
		p := filepath.Join(dir, filepath.FromSlash(inc))
		h, err := readHeader(src[k], inc, p)
		if errors.Is(err, fs.ErrNotExist) {
			return Entry{Kind: Absent}, nil
		}
		if err != nil {
			return Entry{}, err
		}
		return Entry{Kind: Incr, Path: inc, Inc: h}, nil
	}
}

// readHeader reads the header of the INCREMENTAL file rel of a backup (p
// is its path, for messages); a missing file is fs.ErrNotExist.
func readHeader(d *safefs.Dir, rel, p string) (*pgbackup.Incremental, error) {
	f, err := d.OpenRegular(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err != nil {
		return nil, readErr(err, p)
	}
	defer f.Close()
	h, err := pgbackup.ReadIncremental(f)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "damaged incremental file").WithPath(p).
			WithHint("check the backup with pg_verifybackup")
	}
	return h, nil
}
