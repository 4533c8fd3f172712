package pgdata

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pgfork/pgfork/internal/errs"
)

// ResetOptions shape ResetForClone.
type ResetOptions struct {
	// Port, when not 0, becomes the clone's port.
	Port int
}

// AutoConfMarker starts the block ResetForClone appends to postgresql.auto.conf.
const AutoConfMarker = "# pgfork clone: settings of the source that a clone must not inherit"

// ResetForClone makes a COPIED data directory safe to run as a cluster of
// its own. It appends overrides to postgresql.auto.conf, which the server
// reads after postgresql.conf and everything it includes, so they win over
// any setting there (only -c options on the server's command line win over
// them): the port when opts.Port is set, and archive_mode, archive_command,
// primary_conninfo, primary_slot_name and restore_command set to off or
// empty, so the clone neither archives into the source's archive nor
// follows the source's primary, and external_pid_file empty, so it never
// writes the source's pid file. It
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

	var b strings.Builder
	b.WriteString("\n" + AutoConfMarker + "\n")
	if opts.Port != 0 {
		fmt.Fprintf(&b, "port = %d\n", opts.Port)
	}
	for _, s := range []string{"archive_mode = off", "archive_command = ''", "primary_conninfo = ''", "primary_slot_name = ''", "restore_command = ''", "external_pid_file = ''"} {
		b.WriteString(s + "\n")
	}
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
