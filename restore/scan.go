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
// INCREMENTAL files with their headers read, and its tablespaces' (the
// link pg_tblspc/OID becomes a link to the tablespace's new directory,
// then the tablespace's own tree follows, named as manifests name it).
// Anything else but files and directories is refused: pg_basebackup
// writes none, and restore must not hide what it did not rebuild.
func (in *input) scan() ([]Node, error) {
	n := len(in.chain)
	var tree []Node
	var walk func(top, prefix string) error
	walk = func(top, prefix string) error {
		return filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return errs.FromOS(err, p, "cannot read the backup")
			}
			rel, _ := filepath.Rel(top, p)
			if rel == "." {
				return nil
			}
			rel = prefix + filepath.ToSlash(rel)
			fi, err := d.Info()
			if err != nil {
				return errs.FromOS(err, p, "cannot read the backup")
			}
			if d.IsDir() {
				tree = append(tree, Node{Rel: rel, Dir: true, Mode: fi.Mode().Perm()})
				return nil
			}
			if t, inner := in.tablespaceOf(rel + "/"); t != nil && inner == "" && d.Type()&fs.ModeSymlink != 0 {
				tree = append(tree, Node{Rel: rel, Link: t.new})
				return walk(t.src[n-1].Path(), t.prefix())
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
				if nd.Inc, err = in.readHeader(n-1, rel); err != nil {
					return err
				}
			}
			tree = append(tree, nd)
			return nil
		})
	}
	return tree, walk(in.chain.Newest().Dir, "")
}

// lookup is the planner's Lookup over the backups: the file itself in
// backup k, else its INCREMENTAL file, else Absent.
func (in *input) lookup(k int, rel string) (Entry, error) {
	f, err := in.openSource(k, rel)
	if err == nil {
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return Entry{}, errs.FromOS(err, f.Name(), "cannot read the backup")
		}
		return Entry{Kind: Full, Path: rel, Size: fi.Size()}, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return Entry{}, readErr(err, in.sourcePath(k, rel))
	}
	d, base := filepath.ToSlash(filepath.Dir(rel)), filepath.Base(rel)
	inc := d + "/" + pgbackup.IncrementalPrefix + base
	h, err := in.readHeader(k, inc)
	if errors.Is(err, fs.ErrNotExist) {
		return Entry{Kind: Absent}, nil
	}
	if err != nil {
		return Entry{}, err
	}
	return Entry{Kind: Incr, Path: inc, Inc: h}, nil
}

// readHeader reads the header of the INCREMENTAL file rel of backup k; a
// missing file is fs.ErrNotExist.
func (in *input) readHeader(k int, rel string) (*pgbackup.Incremental, error) {
	p := in.sourcePath(k, rel)
	f, err := in.openSource(k, rel)
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
