// Package pgdata knows the rules of PostgreSQL data directories: what a copy
// must leave out or empty, how to read pg_control, which major version wrote
// a directory, where its tablespaces are, whether a server runs on it, and
// how to make a copy safe to start as a cluster of its own.
//
// It needs no running server. It does not copy anything itself: the copy
// engine (package clone) does, shaped by the filters here.
//
// pgdata owns the on-disk rules of a data directory. It must not start or
// stop a server and must not write a source directory: ResetForClone refuses
// a directory with a live postmaster.
package pgdata

import (
	"io/fs"
	"regexp"
	"strings"

	"github.com/pgfork/pgfork/clone"
)

// ServerLogFile is the server log pgfork's instances write into the data
// directory (instance.LogFileName); copies leave it out.
const ServerLogFile = "pgfork-server.log"

// OldClusterLogFile is the log of an old cluster's starts by pgfork
// upgrade --logical, kept in the new cluster's data directory (the old
// one is the user's); copies of the new cluster leave it out.
const OldClusterLogFile = "pgfork-old-cluster.log"

// skipTop are files at the top of a data directory a copy leaves out, as
// pg_basebackup does: they belong to the running source server, to a backup
// in progress, or to recovery, never to an independent copy.
var skipTop = map[string]bool{
	"postmaster.pid":           true,
	"postmaster.opts":          true,
	"backup_label":             true,
	"backup_label.old":         true,
	"tablespace_map":           true,
	"tablespace_map.old":       true,
	"backup_manifest":          true,
	"postgresql.auto.conf.tmp": true,
	"current_logfiles":         true,
	"current_logfiles.tmp":     true,
	"standby.signal":           true,
	"recovery.signal":          true,
	ServerLogFile:              true,
	OldClusterLogFile:          true,
}

// emptyTop are directories a copy keeps but leaves empty: their contents
// are runtime state of the source server (statistics temp files, replication
// slots, dynamic shared memory, notifications, serializable and exported
// snapshots, subtransactions) that PostgreSQL rebuilds or must not inherit.
var emptyTop = map[string]bool{
	"pg_stat_tmp":  true,
	"pg_replslot":  true,
	"pg_dynshmem":  true,
	"pg_notify":    true,
	"pg_serial":    true,
	"pg_snapshots": true,
	"pg_subtrans":  true,
	// The default server log directories: the clone's history starts fresh.
	"log":    true,
	"pg_log": true,
}

// tempRelRe matches temporary relation files: t<backend>_<relfilenode>
// with optional fork and segment suffixes (t3_16384, t3_16384_fsm, t3_16384.1).
var tempRelRe = regexp.MustCompile(`^t\d+_\d+(?:_(?:fsm|vm|init))?(?:\.\d+)?$`)

// Filter decides, for an offline copy of a data directory (the source is
// cleanly shut down), what to copy. It leaves out the files listed in
// DESIGN.md (postmaster.pid, postmaster.opts, backup_label, tablespace_map,
// backup_manifest, postgresql.auto.conf.tmp, current_logfiles(.tmp),
// standby.signal, recovery.signal, pgfork's server log, pg_internal.init*,
// pgsql_tmp*, and temporary relations t<N>_* in base/<db>/), and keeps but
// empties pg_stat_tmp, pg_replslot, pg_dynshmem, pg_notify, pg_serial,
// pg_snapshots, pg_subtrans and the default log directories (log, pg_log).
//
// Tablespaces: the symlinks under pg_tblspc are skipped. The caller copies
// each tablespace (Tablespaces lists them; TablespaceFilter shapes those
// copies) to a new location and creates pg_tblspc/<oid> pointing there, so a
// clone never shares or points back into the source's tablespaces. In-place
// tablespaces (directories under pg_tblspc) are copied like everything else.
func Filter(rel string, d fs.DirEntry) clone.Action {
	return filter(rel, d, false)
}

// OnlineFilter is Filter for a copy taken while the source runs, between
// pg_backup_start and pg_backup_stop: it also keeps pg_wal empty (the WAL
// the copy needs is added afterwards, from the backup's start to its stop
// location; archive_status is recreated by PostgreSQL on start).
func OnlineFilter(rel string, d fs.DirEntry) clone.Action {
	return filter(rel, d, true)
}

func filter(rel string, d fs.DirEntry, online bool) clone.Action {
	top, rest, nested := strings.Cut(rel, "/")
	name := rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		name = rel[i+1:]
	}
	if commonSkip(name) {
		return clone.Skip
	}
	if !nested {
		if d.IsDir() {
			if emptyTop[top] || (online && top == "pg_wal") {
				return clone.EmptyDir
			}
			return clone.Include
		}
		if skipTop[top] {
			return clone.Skip
		}
		return clone.Include
	}
	switch top {
	case "pg_tblspc":
		// pg_tblspc/<oid>: a symlink to the tablespace (copied separately)
		// or, for an in-place tablespace, a directory copied in place.
		if !strings.Contains(rest, "/") && d.Type()&fs.ModeSymlink != 0 {
			return clone.Skip
		}
		if isTempRel(name, d) {
			return clone.Skip
		}
	case "base":
		// base/<dboid>/<file>
		if strings.Count(rest, "/") == 1 && isTempRel(name, d) {
			return clone.Skip
		}
	}
	return clone.Include
}

// TablespaceFilter shapes the copy of one tablespace directory (the target
// of a pg_tblspc/<oid> symlink); rel is relative to that directory, as in
// PG_15_202209061/16384/16385. It leaves out temporary files and relations
// and relation cache init files.
func TablespaceFilter(rel string, d fs.DirEntry) clone.Action {
	name := rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		name = rel[i+1:]
	}
	if commonSkip(name) || isTempRel(name, d) {
		return clone.Skip
	}
	return clone.Include
}

// commonSkip is what is left out wherever it appears.
func commonSkip(name string) bool {
	return strings.HasPrefix(name, "pg_internal.init") || strings.HasPrefix(name, "pgsql_tmp")
}

func isTempRel(name string, d fs.DirEntry) bool {
	return !d.IsDir() && tempRelRe.MatchString(name)
}
