package upgrade

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
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
func smokeCheck(ctx context.Context, inst *instance.Instance, cat *Catalog, fc *fileCheck) error {
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
