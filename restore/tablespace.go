package restore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/safefs"
	"github.com/pgfork/pgfork/pgdata"
)

// User tablespaces, as pg_combinebackup handles them: in a plain-format
// backup, pg_tblspc/OID is a symbolic link to the directory pg_basebackup
// wrote the tablespace to (its own, with --tablespace-mapping) or, for an
// in-place tablespace, a directory. The newest backup's links say which
// tablespaces the result has; each must be mapped (Options.Tablespaces)
// from that link's target to a new directory, where the result's
// tablespace is built (in staging beside it, as the data directory) and
// to which the result's pg_tblspc/OID links. Older backups are read
// through their own links. In-place tablespaces are part of the data
// directory and need nothing.

// tablespace is one user tablespace of the chain outside the data
// directory.
type tablespace struct {
	oid string
	old string // the newest backup's link target (OLDDIR)
	new string // the result's tablespace directory (NEWDIR)
	// src is each backup's own tablespace directory, opened; nil where the
	// backup has none (it was created later).
	src []*safefs.Dir
}

// prefix is the data-directory-relative path of the tablespace's files,
// as manifests name them.
func (t *tablespace) prefix() string { return "pg_tblspc/" + t.oid + "/" }

// ParseTablespaceMapping parses OLDDIR=NEWDIR as pg_combinebackup's
// --tablespace-mapping does ("\=" is an "=" in a name); both must be
// absolute. The paths are cleaned.
func ParseTablespaceMapping(s string) (old, new string, err error) {
	var parts [2]strings.Builder
	i := 0
	for k := 0; k < len(s); k++ {
		switch {
		case s[k] == '\\' && k+1 < len(s) && s[k+1] == '=':
			parts[i].WriteByte('=')
			k++
		case s[k] == '=':
			if i == 1 {
				return "", "", errs.New(errs.Usage, "more than one \"=\" in the tablespace mapping %q", s).
					WithHint(`write it as OLDDIR=NEWDIR; a "=" in a directory's name is written \=`)
			}
			i = 1
		default:
			parts[i].WriteByte(s[k])
		}
	}
	old, new = parts[0].String(), parts[1].String()
	if i == 0 || old == "" || new == "" {
		return "", "", errs.New(errs.Usage, "invalid tablespace mapping %q: it must be OLDDIR=NEWDIR", s).
			WithHint("OLDDIR is where the newest backup's tablespace is (its pg_tblspc link), NEWDIR where the restored one goes")
	}
	if !filepath.IsAbs(old) || !filepath.IsAbs(new) {
		return "", "", errs.New(errs.Usage, "the tablespace mapping %q has a relative path", s).
			WithHint("give both directories as absolute paths")
	}
	return filepath.Clean(old), filepath.Clean(new), nil
}

// findTablespaces reads the newest backup's pg_tblspc, checks that every
// tablespace outside the data directory has a mapping (and every mapping
// a tablespace), that the new directories are usable, and opens each
// backup's tablespace directories.
func (in *input) findTablespaces(mapping map[string]string, dst string) error {
	n := len(in.chain)
	links, err := tablespaceLinks(in.src[n-1], in.chain[n-1].Dir)
	if err != nil {
		return err
	}
	used := map[string]bool{}
	oids := make([]string, 0, len(links))
	for oid := range links {
		oids = append(oids, oid)
	}
	sort.Strings(oids)
	for _, oid := range oids {
		old := filepath.Clean(links[oid])
		new, ok := mapping[old]
		if !ok {
			return errs.New(errs.Usage, "the tablespace at %s (pg_tblspc/%s) has no tablespace mapping", old, oid).
				WithPath(in.chain[n-1].Dir).
				WithHint("map it to a new directory for the restored tablespace (OLDDIR=NEWDIR)").
				WithCLI("add -T %s=NEWDIR", old)
		}
		used[old] = true
		t := &tablespace{oid: oid, old: old, new: new, src: make([]*safefs.Dir, n)}
		if err := in.checkNewDir(t, dst); err != nil {
			return err
		}
		in.ts = append(in.ts, t)
		for k := range in.chain {
			if err := in.openTablespace(t, k); err != nil {
				return err
			}
		}
	}
	for old := range mapping {
		if !used[old] {
			return errs.New(errs.Usage, "no tablespace of the newest backup is at %s (a tablespace mapping names it)", old).
				WithPath(in.chain[n-1].Dir).
				WithHint("map the directories the newest backup's pg_tblspc links point to")
		}
	}
	return nil
}

// tablespaceLinks returns the OID → target of the symbolic links in a
// backup's pg_tblspc (directories there are in-place tablespaces; other
// names are not tablespaces).
func tablespaceLinks(d *safefs.Dir, dir string) (map[string]string, error) {
	links := map[string]string{}
	f, err := d.Open("pg_tblspc")
	if errors.Is(err, fs.ErrNotExist) {
		return links, nil
	}
	if err != nil {
		return nil, readErr(err, filepath.Join(dir, "pg_tblspc"))
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, errs.FromOS(err, filepath.Join(dir, "pg_tblspc"), "cannot read the backup")
	}
	for _, e := range ents {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err != nil || e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		target, err := d.Readlink("pg_tblspc/" + e.Name())
		if err != nil {
			return nil, errs.FromOS(err, filepath.Join(dir, "pg_tblspc", e.Name()), "cannot read the tablespace link")
		}
		if !filepath.IsAbs(target) {
			return nil, errs.New(errs.Usage, "the tablespace link pg_tblspc/%s points to a relative path (%s)", e.Name(), target).
				WithPath(dir).WithHint("pg_basebackup writes absolute links; check the backup with pg_verifybackup")
		}
		links[e.Name()] = target
	}
	return links, nil
}

// openTablespace opens backup k's directory of t, through the backup's
// own pg_tblspc link, if it has one. The directory must belong to the
// backup's owner and be writable by no one else, on a path no one else can
// write (pgdata.OpenLinkedDir, the one check of every copy that follows
// such a link): a link in a backup must not make root read another user's
// files into a result.
func (in *input) openTablespace(t *tablespace, k int) error {
	b := in.chain[k]
	links, err := tablespaceLinks(in.src[k], b.Dir)
	if err != nil {
		return err
	}
	target, ok := links[t.oid]
	if !ok {
		return nil
	}
	f, err := pgdata.OpenLinkedDir(b.Dir, "pg_tblspc/"+t.oid, target)
	if err != nil {
		return err
	}
	defer f.Close()
	d, err := safefs.OpenDir(target)
	if err != nil {
		return errs.FromOS(err, target, "cannot read the tablespace of backup %s", b.Name())
	}
	fi, err1 := f.Stat()
	di, err2 := d.Stat()
	if err := errors.Join(err1, err2); err != nil || !os.SameFile(fi, di) {
		d.Close()
		if err != nil {
			return errs.FromOS(err, target, "cannot read the tablespace of backup %s", b.Name())
		}
		return errs.New(errs.Permission, "the tablespace link pg_tblspc/%s of backup %s changed while it was checked", t.oid, b.Name()).
			WithPath(target).WithHint("a backup's tablespace directories must not change while it is restored; restore again")
	}
	t.src[k] = d
	return nil
}

// checkNewDir checks where t's restored tablespace goes: not inside a
// backup or one of their tablespaces, not the data directory's or
// another tablespace's, and new (an empty directory is taken, as
// pg_combinebackup does).
func (in *input) checkNewDir(t *tablespace, dst string) error {
	abs, _ := filepath.Abs(dst)
	if fsutil.Within(t.new, abs) || fsutil.Within(abs, t.new) {
		return errs.New(errs.Usage, "the tablespace directory %s and the data directory %s overlap", t.new, abs).
			WithHint("restore the tablespace to a directory outside the data directory")
	}
	for _, o := range in.ts {
		if fsutil.Within(t.new, o.new) || fsutil.Within(o.new, t.new) {
			return errs.New(errs.Usage, "tablespaces %s and %s would both be restored to %s", o.oid, t.oid, t.new).
				WithHint("map each tablespace to a directory of its own")
		}
	}
	for _, b := range in.chain {
		if fsutil.WithinByID(filepath.Dir(t.new), b.Dir) {
			return errs.New(errs.Usage, "the tablespace directory is inside a backup").WithPath(t.new).
				WithHint("restore the tablespace outside the backups (they are only read)")
		}
	}
	if fsutil.WithinByID(filepath.Dir(t.new), t.old) {
		return errs.New(errs.Usage, "the tablespace directory is inside the backup's tablespace").WithPath(t.new).
			WithHint("restore the tablespace outside the backups (they are only read)")
	}
	ents, err := os.ReadDir(t.new)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return errs.FromOS(err, t.new, "cannot read the tablespace directory")
	case len(ents) > 0:
		return errs.New(errs.Exists, "the tablespace directory exists and is not empty").WithPath(t.new).
			WithHint("restore the tablespace to a new or empty directory")
	}
	return nil
}

// tablespaceOf returns the tablespace that holds the data-directory-
// relative path rel and rel inside it, or nil.
func (in *input) tablespaceOf(rel string) (*tablespace, string) {
	for _, t := range in.ts {
		if p := t.prefix(); strings.HasPrefix(rel, p) {
			return t, rel[len(p):]
		}
	}
	return nil, rel
}

// openSource opens the data-directory-relative file rel of backup k,
// through the backup's tablespace directory where rel is in one.
func (in *input) openSource(k int, rel string) (*os.File, error) {
	if t, inner := in.tablespaceOf(rel); t != nil {
		if t.src[k] == nil {
			return nil, &os.PathError{Op: "open", Path: filepath.Join(in.chain[k].Dir, rel), Err: fs.ErrNotExist}
		}
		return t.src[k].OpenRegular(inner)
	}
	return in.src[k].OpenRegular(rel)
}

// sourcePath is rel's path in backup k, for messages.
func (in *input) sourcePath(k int, rel string) string {
	if t, inner := in.tablespaceOf(rel); t != nil && t.src[k] != nil {
		return filepath.Join(t.src[k].Path(), filepath.FromSlash(inner))
	}
	return filepath.Join(in.chain[k].Dir, filepath.FromSlash(rel))
}
