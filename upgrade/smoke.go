package upgrade

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
)

// filesKept says whether pg_upgrade keeps relfilenodes and database OIDs:
// from PostgreSQL 15 on (both clusters, to stay on the documented side), a
// relation's files have the same names in the old and the new cluster.
func filesKept(oldMajor, newMajor int) bool {
	return oldMajor >= 15 && newMajor >= 15
}

// fileCheck locates the two clusters' files for the smoke check's
// comparison on disk.
type fileCheck struct {
	oldDir, newDir string
	// oldVersionDirs maps a tablespace OID to the old cluster's
	// PG_<major>_<catversion> directory in it.
	oldVersionDirs map[string]string
	// oldMoved: --mode swap moved the old files into the new cluster.
	oldMoved bool
}

// noTablespaces says whether neither cluster has a tablespace of its own
// (pg_tblspc empty): every database's relation files are then in its
// base/OID directory.
func (fc *fileCheck) noTablespaces() bool {
	for _, dir := range []string{fc.oldDir, fc.newDir} {
		ents, err := os.ReadDir(filepath.Join(dir, "pg_tblspc"))
		if err != nil || len(ents) > 0 {
			return false
		}
	}
	return true
}

// hasUserFiles says whether a database directory holds a file of a user
// relation: a name starting with a relfilenode of 16384 (FirstNormalObjectId)
// or more ("16385", "16385_fsm", "16385.1"). Everything initdb and CREATE
// DATABASE make is below it. An unreadable directory counts as having
// some, so that the database is checked through a connection.
func hasUserFiles(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return true
	}
	defer f.Close()
	for {
		names, err := f.Readdirnames(256)
		for _, n := range names {
			end := strings.IndexFunc(n, func(r rune) bool { return r < '0' || r > '9' })
			if end < 0 {
				end = len(n)
			}
			if v, err := strconv.ParseUint(n[:end], 10, 32); err == nil && v >= 16384 {
				return true
			}
		}
		if err != nil {
			return err != io.EOF
		}
	}
}

// filesOnDisk returns the comparison on disk for the start phase's smoke
// check, or nil where pg_upgrade does not keep relfilenodes.
func (u *upgrader) filesOnDisk(cat *Catalog) *fileCheck {
	if !filesKept(cat.Major, u.o.New.Major) {
		return nil
	}
	fc := &fileCheck{oldDir: u.o.OldDir, newDir: u.o.NewDir, oldVersionDirs: map[string]string{}, oldMoved: u.res.Mode == Swap}
	for _, ts := range u.res.Tablespaces {
		fc.oldVersionDirs[ts.OID] = ts.VersionDir
	}
	return fc
}

// oldPath maps a file of the new cluster (pg_relation_filepath: base/DB/N
// or pg_tblspc/TS/PG_<new>_<cat>/DB/N) to the old cluster's file of the
// same relation.
func (fc *fileCheck) oldPath(rel string) string {
	parts := strings.Split(rel, "/")
	if len(parts) == 5 && parts[0] == "pg_tblspc" {
		if vd, ok := fc.oldVersionDirs[parts[1]]; ok {
			parts[2] = vd
		}
	}
	return filepath.Join(fc.oldDir, filepath.Join(parts...))
}

// connectTo returns the databases of dbs the smoke check connects to, and
// how many it checks by name and OID alone (see smokeCheck): only with
// fc, without tablespaces, and for databases with no user relations
// counted and no user relation files in either cluster's base/OID.
func connectTo(dbs []string, cat *Catalog, fc *fileCheck, oldDBs, newDBs map[string]uint32) ([]string, int) {
	if fc == nil || !fc.noTablespaces() {
		return dbs, 0
	}
	var out []string
	for _, db := range dbs {
		oid, newOID := oldDBs[db], newDBs[db]
		if cat.Relations[db] > 0 || oid == 0 || hasUserFiles(filepath.Join(fc.newDir, "base", strconv.FormatUint(uint64(newOID), 10))) ||
			(!fc.oldMoved && hasUserFiles(filepath.Join(fc.oldDir, "base", strconv.FormatUint(uint64(oid), 10)))) {
			out = append(out, db)
		}
	}
	return out, len(dbs) - len(out)
}

// smokeSQL counts a database's user relations and lists the files of its
// user relations with storage (OIDs from FirstNormalObjectId, 16384: the
// user's tables, indexes, sequences, materialized views and their TOAST).
const smokeSQL = `SELECT
 (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE ` + userSchemas + `),
 coalesce((SELECT array_agg(pg_relation_filepath(c.oid) ORDER BY c.oid) FROM pg_class c
   WHERE c.oid >= 16384 AND c.relkind IN ('r', 'i', 'S', 't', 'm') AND c.relpersistence <> 't'), '{}')`

// smokeCheck checks an upgraded cluster against the old one's catalog:
// the same databases (with the same OIDs where pg_upgrade keeps them), each
// of which accepts a connection; the same number of user relations in
// each where the old cluster's were counted (cat.Relations); and, with fc,
// every user relation's file in the new cluster and under the same name in
// the old one. The comparison on disk replaces counting relations through
// the old server, one connection per database, when the old catalogs are
// read without a rehearsal: pg_upgrade itself fails when an old relation
// has no match in the new cluster, and the files show that each new one
// was carried over from the old cluster rather than made anew.
//
// With fc, a database that has no user relation files in either cluster
// (an empty database: nothing to compare on disk) and no user relations
// counted on the old cluster is checked by its name and OID alone, without
// a connection of its own: pg_upgrade connected to every database of the
// new cluster to map its relations, and with a thousand such databases the
// connections were most of pgfork's time besides pg_upgrade. onInfo, if
// set, hears how many databases were checked each way.
func smokeCheck(ctx context.Context, inst *instance.Instance, cat *Catalog, fc *fileCheck, onInfo func(string)) error {
	fail := func(format string, args ...any) error {
		return errs.New(errs.Internal, "smoke check of the upgraded cluster failed: "+format, args...).
			WithHint("compare the clusters before using the new one")
	}
	conn, err := pgx.Connect(ctx, inst.ConnString(cat.Superuser, "template1"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "smoke check of the upgraded cluster failed: cannot connect to template1")
	}
	newDBs, err := listDatabases(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "smoke check of the upgraded cluster failed")
	}
	oldDBs := cat.Databases
	if oldDBs == nil { // a catalog read before databases were listed
		oldDBs = map[string]uint32{}
		for db := range cat.Relations {
			oldDBs[db] = 0
		}
	}
	var bad []string
	dbs := make([]string, 0, len(oldDBs))
	for db, oid := range oldDBs {
		n, ok := newDBs[db]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("database %q is missing", db))
		case fc != nil && oid != 0 && n != oid:
			bad = append(bad, fmt.Sprintf("database %q has OID %d, %d in the old cluster", db, n, oid))
		default:
			dbs = append(dbs, db)
		}
	}
	for db := range newDBs {
		if _, ok := oldDBs[db]; !ok {
			bad = append(bad, fmt.Sprintf("database %q is new", db))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fail("%s", strings.Join(bad, "; "))
	}
	dbs, listed := connectTo(dbs, cat, fc, oldDBs, newDBs)
	if listed > 0 && onInfo != nil {
		onInfo(fmt.Sprintf("smoke check: %d databases without user relation files in either cluster checked by name and OID (pg_upgrade connected to each); %d checked through a connection",
			listed, len(dbs)))
	}
	var mu sync.Mutex
	err = eachDatabase(ctx, inst, cat.Superuser, dbs, func(ctx context.Context, conn *pgx.Conn, db string) error {
		var n int64
		var files []string
		if err := conn.QueryRow(ctx, smokeSQL).Scan(&n, &files); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the catalog of database %q", db)
		}
		var miss []string
		if old, ok := cat.Relations[db]; ok && old != n {
			miss = append(miss, fmt.Sprintf("database %q: %d user relations, the old cluster had %d", db, n, old))
		}
		if fc != nil {
			for _, f := range files {
				if _, err := os.Stat(filepath.Join(fc.newDir, f)); err != nil {
					miss = append(miss, fmt.Sprintf("database %q: relation file %s is missing", db, filepath.Join(fc.newDir, f)))
					continue
				}
				if fc.oldMoved {
					continue
				}
				if op := fc.oldPath(f); func() bool { _, err := os.Stat(op); return err != nil }() {
					miss = append(miss, fmt.Sprintf("database %q: relation file %s has no counterpart %s in the old cluster", db, filepath.Join(fc.newDir, f), op))
				}
			}
		}
		mu.Lock()
		bad = append(bad, miss...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return errs.Wrap(errs.Internal, err, "smoke check of the upgraded cluster failed")
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		if len(bad) > 10 {
			bad = append(bad[:10], fmt.Sprintf("... and %d more", len(bad)-10))
		}
		return fail("%s", strings.Join(bad, "; "))
	}
	return nil
}
