package upgrade

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// Catalog is what pgfork reads from the old cluster's catalogs.
type Catalog struct {
	// Superuser is the bootstrap superuser (the role with OID 10), which
	// pg_upgrade requires to be the new cluster's install user too.
	Superuser string `json:"superuser"`
	// Encoding, Collate, Ctype, LocaleProvider ("c", "i", "b") and
	// ICULocale are template0's, which initdb set from its options.
	Encoding       string `json:"encoding"`
	Collate        string `json:"collate"`
	Ctype          string `json:"ctype"`
	LocaleProvider string `json:"locale_provider"`
	ICULocale      string `json:"icu_locale,omitempty"`
	// Major is the cluster's PostgreSQL major.
	Major int `json:"major"`
	// Databases maps each database that accepts connections to its OID
	// (pg_upgrade keeps database OIDs from PostgreSQL 15 on).
	Databases map[string]uint32 `json:"databases"`
	// Relations counts user relations per database (not catalogs, not
	// TOAST), for the smoke check after the upgrade. It is read with one
	// connection per database, so only where it is needed (perDatabase):
	// for the rehearsal, the comparison after it, and upgrades from or to
	// a PostgreSQL before 15; elsewhere it is nil and the smoke check
	// compares the relations' files on disk instead (see smokeCheck).
	Relations map[string]int64 `json:"relations,omitempty"`
	// Extensions lists each database's extensions ("name version, ..."),
	// and Fingerprints hashes each database's user catalog (relations and
	// their kinds, functions, types, extensions): what the upgrade
	// compares to notice a catalog change between the rehearsal and the
	// stop of the old cluster.
	Extensions   map[string]string `json:"extensions,omitempty"`
	Fingerprints map[string]string `json:"fingerprints,omitempty"`
}

// trustHBA is the pg_hba.conf pgfork starts clusters with while it works on
// them: only its own private socket is open, so trust is safe, and it makes
// the upgrade independent of the cluster's own authentication setup.
const trustHBA = "local all all trust\n"

// writeHBA writes the private pg_hba.conf into dir and returns its path.
func writeHBA(dir string, u *instance.OSUser) (string, error) {
	p := filepath.Join(dir, "pgfork_hba.conf")
	if err := instance.WriteFileAs(p, u, []byte(trustHBA)); err != nil {
		return "", err
	}
	return p, nil
}

// privateSettings are the settings pgfork starts a cluster with while it
// works on it: no TCP, no archiving, trust on the private socket only.
func privateSettings(hba string) map[string]string {
	return map[string]string{
		"hba_file":     hba,
		"archive_mode": "off",
	}
}

// serverCfg returns the instance.Config to start dataDir privately.
func serverCfg(bin Install, dataDir, workDir, hba, logName string, u *instance.OSUser) instance.Config {
	return instance.Config{
		BinDir: bin.BinDir, Env: bin.Env, DataDir: dataDir, User: u,
		SocketDir: "", // a private directory under the temp dir
		Settings:  privateSettings(hba),
		LogFile:   filepath.Join(workDir, logName),
	}
}

// superuserCandidates are the role names tried when connecting to a cluster
// whose bootstrap superuser is not known yet.
func superuserCandidates(explicit, dataDir string) []string {
	if explicit != "" {
		return []string{explicit}
	}
	c := []string{"postgres"}
	if u, err := instance.OwnerOf(dataDir); err == nil && u.Name != "postgres" && u.Name != "root" {
		c = append(c, u.Name)
	}
	if n := os.Getenv("USER"); n != "" && n != "postgres" && n != "root" {
		c = append(c, n)
	}
	return c
}

// connectAny connects to db on inst as the first candidate role that exists.
func connectAny(ctx context.Context, inst *instance.Instance, roles []string, db string) (*pgx.Conn, string, error) {
	var last error
	for _, r := range roles {
		conn, err := pgx.Connect(ctx, inst.ConnString(r, db))
		if err == nil {
			return conn, r, nil
		}
		last = err
	}
	return nil, "", dbclone.SQLError(ctx, last, "cannot connect to the old cluster as any of %s", strings.Join(roles, ", ")).
		WithHint("name its bootstrap superuser").WithCLI("pass --superuser NAME")
}

// perDatabase says which databases readCatalog reads one by one (relation
// count, extensions, fingerprint: one connection each).
type perDatabase struct {
	// all: every database that accepts connections; otherwise none.
	all bool
	// known returns, without a connection, what is known of a database
	// (see knownSince); nil: nothing is.
	known func(db string, oid uint32) (dbInfo, bool)
}

// readCatalog reads the settings and databases of a running cluster, and
// with per.all each database's relation count, extensions and fingerprint
// (one connection per database, except those per.known knows); known
// counts those.
func readCatalog(ctx context.Context, inst *instance.Instance, roles []string, per perDatabase) (c *Catalog, known int, err error) {
	conn, role, err := connectAny(ctx, inst, roles, "template1")
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.Background())
	c = &Catalog{Databases: map[string]uint32{}}
	if err := conn.QueryRow(ctx, `SELECT rolname FROM pg_authid WHERE oid = 10`).Scan(&c.Superuser); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot read the bootstrap superuser")
	}
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&c.Major); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot read the server version")
	}
	q := `SELECT pg_encoding_to_char(encoding), datcollate, datctype, 'c', '' FROM pg_database WHERE datname = 'template0'`
	switch {
	case c.Major >= 17:
		q = `SELECT pg_encoding_to_char(encoding), datcollate, datctype, datlocprovider::text, coalesce(datlocale, '') FROM pg_database WHERE datname = 'template0'`
	case c.Major >= 15:
		q = `SELECT pg_encoding_to_char(encoding), datcollate, datctype, datlocprovider::text, coalesce(daticulocale, '') FROM pg_database WHERE datname = 'template0'`
	}
	if err := conn.QueryRow(ctx, q).Scan(&c.Encoding, &c.Collate, &c.Ctype, &c.LocaleProvider, &c.ICULocale); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot read template0's encoding and locale")
	}
	if c.Databases, err = listDatabases(ctx, conn); err != nil {
		return nil, 0, err
	}
	if !per.all {
		return c, 0, nil
	}
	infos := make(map[string]dbInfo, len(c.Databases))
	dbs := make([]string, 0, len(c.Databases))
	for db, oid := range c.Databases {
		if per.known != nil {
			if in, ok := per.known(db, oid); ok {
				infos[db] = in
				continue
			}
		}
		dbs = append(dbs, db)
	}
	known = len(infos)
	read, err := inspectDatabases(ctx, inst, role, dbs)
	if err != nil {
		return nil, 0, err
	}
	maps.Copy(infos, read)
	c.Relations, c.Extensions, c.Fingerprints = map[string]int64{}, map[string]string{}, map[string]string{}
	for db, in := range infos {
		c.Relations[db], c.Extensions[db], c.Fingerprints[db] = in.relations, in.extensions, in.fingerprint
	}
	return c, known, nil
}

// knownSince returns a perDatabase.known that takes a database of the
// cluster in dataDir as cat (read on the rehearsal's clone of it, taken
// from since on) saw it when it has the same OID and no file in its
// directory base/OID was written after since. Whatever changed it after the
// clone was taken was written by the stop's shutdown checkpoint at the
// latest, so its catalog files would show it. File times lag the clock by
// a tick: a second of margin only reads more databases again. A database
// whose directory is elsewhere (its own default tablespace), or cannot be
// read, is read again.
func knownSince(dataDir string, cat *Catalog, since time.Time) func(string, uint32) (dbInfo, bool) {
	since = since.Add(-time.Second)
	return func(db string, oid uint32) (dbInfo, bool) {
		if was, ok := cat.Databases[db]; !ok || was != oid {
			return dbInfo{}, false
		}
		rel, ok := cat.Relations[db]
		if !ok || !unwrittenSince(filepath.Join(dataDir, "base", strconv.FormatUint(uint64(oid), 10)), since) {
			return dbInfo{}, false
		}
		return dbInfo{relations: rel, extensions: cat.Extensions[db], fingerprint: cat.Fingerprints[db]}, true
	}
}

// unwrittenSince says whether dir holds only regular files, none of them
// modified after t.
func unwrittenSince(dir string, t time.Time) bool {
	es, err := os.ReadDir(dir)
	if err != nil || len(es) == 0 {
		return false
	}
	for _, e := range es {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || fi.ModTime().After(t) {
			return false
		}
	}
	return true
}

// listDatabases maps the databases that accept connections to their OIDs.
func listDatabases(ctx context.Context, conn *pgx.Conn) (map[string]uint32, error) {
	rows, err := conn.Query(ctx, `SELECT datname, oid FROM pg_database WHERE datallowconn`)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	out := map[string]uint32{}
	var name string
	var oid uint32
	if _, err := pgx.ForEachRow(rows, []any{&name, &oid}, func() error { out[name] = oid; return nil }); err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	return out, nil
}

// userSchemas restricts a query on namespace n to the user's schemas.
const userSchemas = `n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  AND n.nspname NOT LIKE 'pg_temp_%' AND n.nspname NOT LIKE 'pg_toast_temp_%'`

// inspectSQL counts a database's user relations, lists its extensions and
// hashes its user catalog, in one round trip.
const inspectSQL = `SELECT
 (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE ` + userSchemas + `),
 coalesce((SELECT string_agg(extname || ' ' || extversion, ', ' ORDER BY extname) FROM pg_extension), ''),
 md5(concat_ws('|',
  (SELECT string_agg(s, ',' ORDER BY s) FROM (SELECT format('%s.%s:%s', n.nspname, c.relname, c.relkind) s
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE ` + userSchemas + `) r),
  (SELECT string_agg(s, ',' ORDER BY s) FROM (SELECT p.oid::regprocedure::text s
     FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE ` + userSchemas + `) f),
  (SELECT string_agg(s, ',' ORDER BY s) FROM (SELECT format('%s.%s', n.nspname, t.typname) s
     FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE ` + userSchemas + `) t),
  (SELECT string_agg(extname || ' ' || extversion, ',' ORDER BY extname) FROM pg_extension)))`

// dbInfo is what inspectSQL returns for one database.
type dbInfo struct {
	relations   int64
	extensions  string
	fingerprint string
}

// inspectDatabases connects to every database in dbs (a few at a time) and
// runs inspectSQL.
func inspectDatabases(ctx context.Context, inst *instance.Instance, role string, dbs []string) (map[string]dbInfo, error) {
	out := make(map[string]dbInfo, len(dbs))
	var mu sync.Mutex
	err := eachDatabase(ctx, inst, role, dbs, func(ctx context.Context, conn *pgx.Conn, db string) error {
		var in dbInfo
		if err := conn.QueryRow(ctx, inspectSQL).Scan(&in.relations, &in.extensions, &in.fingerprint); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the catalog of database %q", db)
		}
		mu.Lock()
		out[db] = in
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// dbConns is how many databases eachDatabase works on at a time: each
// new connection is a backend start that builds its relation cache, work
// for the server's cores, so a few more than two at a time only queue.
const dbConns = 4

// eachDatabase connects to every database in dbs as role, dbConns at a
// time, and runs fn on each connection.
func eachDatabase(ctx context.Context, inst *instance.Instance, role string, dbs []string, fn func(context.Context, *pgx.Conn, string) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(dbConns)
	for _, db := range dbs {
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(gctx, time.Minute)
			defer cancel()
			conn, err := pgx.Connect(cctx, inst.ConnString(role, db))
			if err != nil {
				return errs.Wrap(errs.Internal, err, "cannot connect to database %q", db)
			}
			defer conn.Close(context.Background())
			return fn(cctx, conn, db)
		})
	}
	return g.Wait()
}

// initOptions returns the initdb options that make a new cluster match the
// old one: the same bootstrap superuser, encoding, locale, locale provider,
// data checksums (PostgreSQL 18's initdb turns them on by default, which
// pg_upgrade from a cluster without them refuses) and WAL segment size.
func initOptions(bin Install, dataDir string, u *instance.OSUser, ctl *pgdata.ControlData, cat *Catalog, noSync bool) instance.InitOptions {
	sums := ctl.ChecksumsEnabled()
	o := instance.InitOptions{
		BinDir: bin.BinDir, Env: bin.Env, DataDir: dataDir, User: u,
		Superuser: cat.Superuser, Encoding: cat.Encoding, Locale: cat.Collate,
		Checksums: &sums, NoSync: noSync,
	}
	if cat.Ctype != cat.Collate {
		o.Extra = append(o.Extra, "--lc-ctype="+cat.Ctype)
	}
	switch cat.LocaleProvider {
	case "i":
		o.Extra = append(o.Extra, "--locale-provider=icu", "--icu-locale="+cat.ICULocale)
	case "b":
		o.Extra = append(o.Extra, "--locale-provider=builtin", "--builtin-locale="+cat.ICULocale)
	}
	if ctl.WALSegmentSize > 0 && ctl.WALSegmentSize != 16<<20 {
		o.Extra = append(o.Extra, fmt.Sprintf("--wal-segsize=%d", ctl.WALSegmentSize>>20))
	}
	// Remote connections need a password; the local socket keeps initdb's
	// trust (pg_upgrade connects through it). pgfork says so in its summary.
	o.Extra = append(o.Extra, "--auth-host=scram-sha-256")
	return o
}

// catalogChanges lists, in plain words, how the catalogs in b differ from
// those read earlier in a (at most max entries). reinit says the new
// cluster must be initialized again (the bootstrap superuser, encoding or
// locale differ).
func catalogChanges(a, b *Catalog, max int) (changes []string, reinit bool) {
	if a.Superuser != b.Superuser || a.Encoding != b.Encoding || a.Collate != b.Collate || a.Ctype != b.Ctype ||
		a.LocaleProvider != b.LocaleProvider || a.ICULocale != b.ICULocale {
		reinit = true
		changes = append(changes, "the bootstrap superuser, encoding or locale changed")
	}
	var dbs []string
	for db := range b.Relations {
		dbs = append(dbs, db)
	}
	for db := range a.Relations {
		if _, ok := b.Relations[db]; !ok {
			dbs = append(dbs, db)
		}
	}
	sort.Strings(dbs)
	for _, db := range dbs {
		_, inA := a.Relations[db]
		_, inB := b.Relations[db]
		switch {
		case !inA:
			changes = append(changes, fmt.Sprintf("database %q was created", db))
		case !inB:
			changes = append(changes, fmt.Sprintf("database %q was dropped", db))
		case a.Extensions[db] != b.Extensions[db]:
			changes = append(changes, fmt.Sprintf("the extensions of database %q changed (%s → %s)", db, orNone(a.Extensions[db]), orNone(b.Extensions[db])))
		case a.Relations[db] != b.Relations[db]:
			changes = append(changes, fmt.Sprintf("database %q has %d user relations, %d at the rehearsal", db, b.Relations[db], a.Relations[db]))
		case a.Fingerprints[db] != b.Fingerprints[db]:
			changes = append(changes, fmt.Sprintf("the schema of database %q changed (relations, functions or types)", db))
		}
	}
	if len(changes) > max {
		changes = append(changes[:max], fmt.Sprintf("... and %d more", len(changes)-max))
	}
	return changes, reinit
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
