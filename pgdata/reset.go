package pgdata

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/safefs"
)

// ResetOptions shape ResetForClone.
type ResetOptions struct {
	// Port, when not 0, becomes the clone's port.
	Port int
}

// AutoConfMarker starts the block ResetForClone appends to postgresql.auto.conf.
const AutoConfMarker = "# pgfork clone: settings of the source that a clone must not inherit"

// ResetForClone makes a COPIED data directory safe to run as a cluster of
// its own. It first removes the lines that set primary_conninfo,
// primary_slot_name, restore_command, archive_command,
// archive_cleanup_command and recovery_end_command from
// postgresql.auto.conf, postgresql.conf and every file they include that
// lies in the data directory (conf.d): a standby's primary_conninfo may
// hold its primary's replication password (pg_basebackup -R writes it
// there), and a clone must carry no credential of its source's primary.
// Then it appends overrides to postgresql.auto.conf, which the server
// reads after postgresql.conf and everything it includes, so they win over
// any setting there (only -c options on the server's command line win over
// them): the port when opts.Port is set, and archive_mode, archive_command,
// primary_conninfo, primary_slot_name and restore_command set to off or
// empty, so the clone neither archives into the source's archive nor
// follows the source's primary, and every setting of ForeignSettings made
// safe (ForeignOverrides: no library, command or file chosen by whoever
// wrote the source; a plain clone is started by a command pgfork prints,
// not through cluster.StartBranch). It refuses a configuration that
// includes files outside the data directory. It also removes
// data_directory, which would point the clone at the source. It
// removes standby.signal and recovery.signal, postmaster.opts and a stale
// postmaster.pid, and empties pg_replslot (slots would hold WAL forever and
// confuse the source's consumers). It keeps backup_label and tablespace_map,
// which an online clone needs for its first start.
//
// Never call it on a source data directory: it rewrites its configuration.
// It refuses (errs.Busy) when postmaster.pid names a live process.
func ResetForClone(dataDir string, opts ResetOptions) error {
	if err := Check(dataDir); err != nil {
		return err
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return errs.New(errs.Usage, "bad port %d", opts.Port).WithHint("give a port between 1 and 65535")
	}
	pid, running, err := Running(dataDir)
	if err != nil {
		return err
	}
	if running {
		return errs.New(errs.Busy, "a server (pid %d) runs on this data directory; refusing to reset it", pid).WithPath(dataDir).
			WithHint("ResetForClone is for a copy, never for a running source; stop the server if this really is a copy")
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		return statErr(err, dataDir, "", "")
	}
	owner := fi.Sys().(*syscall.Stat_t)

	for _, f := range []string{"postmaster.pid", "postmaster.opts", "standby.signal", "recovery.signal"} {
		p := filepath.Join(dataDir, f)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return errs.Wrap(errs.Internal, err, "cannot remove %s", f).WithPath(p)
		}
	}
	slots := filepath.Join(dataDir, "pg_replslot")
	ents, err := os.ReadDir(slots)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return errs.Wrap(errs.Internal, err, "cannot read replication slots").WithPath(slots)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(slots, e.Name())); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot remove replication slot %s", e.Name()).WithPath(slots)
		}
	}
	if errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(slots, 0o700); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot create pg_replslot").WithPath(slots)
		}
		_ = os.Chown(slots, int(owner.Uid), int(owner.Gid))
	}

	if err := stripSettings(dataDir, cloneStripped); err != nil {
		return err
	}

	overrides, err := ForeignOverrides(dataDir)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("\n" + AutoConfMarker + "\n")
	if opts.Port != 0 {
		fmt.Fprintf(&b, "port = %d\n", opts.Port)
	}
	for _, s := range []string{"archive_mode = off", "primary_conninfo = ''", "primary_slot_name = ''"} {
		b.WriteString(s + "\n")
	}
	b.WriteString(ForeignConf(overrides))
	return appendOwned(filepath.Join(dataDir, "postgresql.auto.conf"), b.String(), int(owner.Uid), int(owner.Gid))
}

// appendOwned appends text to p (creating it 0600 and owned by uid/gid if
// missing) and syncs it.
func appendOwned(p, text string, uid, gid int) error {
	_, statErr := os.Lstat(p)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot open postgresql.auto.conf").WithPath(p)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		_ = f.Chown(uid, gid)
	}
	_, err = f.WriteString(text)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errs.FromOS(err, p, "cannot write postgresql.auto.conf")
	}
	return nil
}

// cloneStripped are the settings ResetForClone removes from a clone's
// configuration files: those that name the source's primary or archive
// (and may carry their credentials), and data_directory.
var cloneStripped = map[string]bool{"primary_conninfo": true, "primary_slot_name": true, "restore_command": true,
	"archive_command": true, "archive_cleanup_command": true, "recovery_end_command": true, "data_directory": true}

// stripSettings removes the lines setting any of names from the data
// directory's postgresql.auto.conf and postgresql.conf and from the files
// they include (include, include_if_exists, include_dir) that lie in the
// data directory. Files are read without following symlinks (a link or a
// file outside the data directory is left alone: it is not part of the
// copy) and rewritten in place by a new file renamed over the old one,
// with its owner and mode.
func stripSettings(dataDir string, names map[string]bool) error {
	d, err := safefs.OpenDir(dataDir)
	if err != nil {
		return errs.FromOS(err, dataDir, "cannot open the data directory")
	}
	defer d.Close()
	seen := map[string]bool{}
	var walk func(rel string, depth int) error
	walk = func(rel string, depth int) error {
		if seen[rel] || depth > 10 {
			return nil
		}
		seen[rel] = true
		b, err := d.ReadFile(rel, 16<<20)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, safefs.ErrSymlink) || errors.Is(err, safefs.ErrNotRegular) {
			return nil
		}
		if err != nil {
			return errs.FromOS(err, filepath.Join(dataDir, rel), "cannot read a configuration file of the clone")
		}
		lines := strings.SplitAfter(string(b), "\n")
		kept := lines[:0:0]
		var includes []string
		for _, l := range lines {
			name, value, ok := parseConfLine(l)
			switch {
			case ok && names[name]:
				continue
			case ok && (name == "include" || name == "include_if_exists"):
				includes = append(includes, value)
			case ok && name == "include_dir":
				dir := resolveInclude(filepath.Join(dataDir, rel), value)
				if r, ok := relBelow(dataDir, dir); ok {
					if f, err := d.Open(r); err == nil {
						ents, _ := f.ReadDir(-1)
						f.Close()
						sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
						for _, e := range ents {
							if n := e.Name(); !strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".conf") && e.Type().IsRegular() {
								includes = append(includes, filepath.Join(dir, n))
							}
						}
					}
				}
			}
			kept = append(kept, l)
		}
		if len(kept) != len(lines) {
			if err := rewriteFile(filepath.Join(dataDir, rel), strings.Join(kept, "")); err != nil {
				return err
			}
		}
		for _, inc := range includes {
			if r, ok := relBelow(dataDir, resolveInclude(filepath.Join(dataDir, rel), inc)); ok {
				if err := walk(r, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, f := range []string{"postgresql.conf", "postgresql.auto.conf"} {
		if err := walk(f, 0); err != nil {
			return err
		}
	}
	return nil
}

// relBelow returns p relative to dir when p lies below it.
func relBelow(dir, p string) (string, bool) {
	r, err := filepath.Rel(dir, p)
	if err != nil || r == "." || r == ".." || strings.HasPrefix(r, "../") {
		return "", false
	}
	return r, true
}

// rewriteFile replaces the regular file p with text: a new file in the
// same directory, with p's owner and mode, synced and renamed over it.
func rewriteFile(p, text string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return errs.FromOS(err, p, "cannot rewrite a configuration file of the clone")
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".pgfork-"+filepath.Base(p)+"-*")
	if err != nil {
		return errs.FromOS(err, p, "cannot rewrite a configuration file of the clone")
	}
	tmp := f.Name()
	st := fi.Sys().(*syscall.Stat_t)
	_, err = f.WriteString(text)
	if err == nil {
		err = f.Chmod(fi.Mode().Perm())
	}
	if err == nil && os.Geteuid() == 0 {
		err = f.Chown(int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return errs.FromOS(err, p, "cannot rewrite a configuration file of the clone")
	}
	return nil
}
