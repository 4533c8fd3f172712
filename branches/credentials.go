package branches

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
)

// scrubbedMark is the file a branch's data directory holds once
// scrubCredentials ran on it (a snapshot of that branch, and so its
// branches, carry it: they hold nothing more to scrub). Its removal only
// makes the next start scrub again. The name changed when the scrub came to
// cover databases closed to connections (issue 57): a branch scrubbed
// before, or made from a snapshot of one, is scrubbed again at its next
// start.
const scrubbedMark = "pgfork-credentials-scrubbed-all-databases"

// scrubCredentials removes from a branch, in every database, those closed
// to connections too, the credentials of other systems that the source
// keeps in its catalogs and that the branch's role could read
// (pg_read_all_data reads every catalog): logical subscriptions (their
// connection strings name the publisher, often with a password; a
// subscription that ran in a branch would also take changes from the
// publisher's slot away from the source's own subscriber) are disabled,
// detached from their slot and dropped; the password option of every user
// mapping is dropped; grants on functions PostgreSQL keeps from PUBLIC
// are revoked (revokeGrantsBeyondInit). Roles' passwords are setUpRole's.
// Branches run with no logical replication worker (branchSettings), so no
// subscription runs before this.
//
// pg_subscription is a shared catalog: the branch's role reads every
// database's subscriptions from any database, and could reopen a closed
// database whose owner it reaches (and read its user mappings). A
// subscription is dropped only from its own database, so a database closed
// to connections is opened for the scrub and closed again (the branch is a
// copy: the source keeps it as it was). Only an invalid database (a DROP
// DATABASE cut short, datconnlimit -2) is left: no one connects to it, and
// it holds no subscription (DROP DATABASE refuses a database that has one).
// The scrub fails if a subscription is left anywhere.
//
// sock reaches the branch's server over its private socket as the
// bootstrap superuser.
func (m *Manager) scrubCredentials(ctx context.Context, sock *instance.Instance, data, role string) error {
	if _, err := os.Lstat(filepath.Join(data, scrubbedMark)); err == nil {
		return nil
	}
	conn, err := pgx.Connect(ctx, sock.ConnString(m.o.SuperUser, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SET search_path = pg_catalog, pg_temp"); err != nil {
		return err
	}
	type database struct {
		name string
		open bool
	}
	rows, err := conn.Query(ctx, "SELECT datname, datallowconn FROM pg_database WHERE datconnlimit <> -2 ORDER BY datname")
	if err != nil {
		return err
	}
	dbs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (database, error) {
		var d database
		err := r.Scan(&d.name, &d.open)
		return d, err
	})
	if err != nil {
		return err
	}
	for _, db := range dbs {
		if err := m.scrubDatabase(ctx, conn, sock.ConnString(m.o.SuperUser, db.name), db.name, db.open, role); err != nil {
			return errs.Wrap(errs.KindOf(err), err, "database %q", db.name)
		}
	}
	var left string
	if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(format('%s (database oid %s)', subname, subdbid), ', '), '')
		FROM pg_subscription`).Scan(&left); err != nil {
		return err
	}
	if left != "" {
		return errs.New(errs.Internal, "subscriptions left after the scrub: %s", left)
	}
	if err := instance.WriteFileAs(filepath.Join(data, scrubbedMark), m.o.User, []byte("subscriptions and user mapping passwords removed in every database, superusers' objects given to the branch's role by pgfork\n")); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// scrubDatabase is scrubCredentials in database db (url reaches it), and,
// if it accepts connections (open), takeOverSuperusersObjects there for
// role. A closed database is opened over admin (the bootstrap superuser's
// connection to another database) for the scrub alone and closed again
// before it returns, error or not: it is left as the source has it, but
// for the credentials.
func (m *Manager) scrubDatabase(ctx context.Context, admin *pgx.Conn, url, db string, open bool, role string) (err error) {
	if !open {
		id := pgx.Identifier{db}.Sanitize()
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+id+" ALLOW_CONNECTIONS true"); err != nil {
			return err
		}
		defer func() {
			if _, cerr := admin.Exec(context.WithoutCancel(ctx), "ALTER DATABASE "+id+" ALLOW_CONNECTIONS false"); err == nil {
				err = cerr
			}
		}()
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, "SET search_path = pg_catalog, pg_temp"); err != nil {
		return err
	}
	rows, err := c.Query(ctx, `SELECT subname FROM pg_subscription
		WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return err
	}
	subs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, s := range subs {
		id := pgx.Identifier{s}.Sanitize()
		// One statement each: DROP SUBSCRIPTION refuses a transaction block;
		// without a slot it does not connect to the publisher.
		for _, q := range []string{"ALTER SUBSCRIPTION " + id + " DISABLE", "ALTER SUBSCRIPTION " + id + " SET (slot_name = NONE)",
			"DROP SUBSCRIPTION " + id} {
			if _, err := c.Exec(ctx, q); err != nil {
				return err
			}
		}
	}
	rows, err = c.Query(ctx, `SELECT coalesce((SELECT rolname FROM pg_authid WHERE oid = um.umuser), ''), s.srvname
		FROM pg_user_mapping um JOIN pg_foreign_server s ON s.oid = um.umserver
		WHERE EXISTS (SELECT FROM unnest(um.umoptions) o WHERE o LIKE 'password=%')`)
	if err != nil {
		return err
	}
	type mapping struct{ user, server string }
	maps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (mapping, error) {
		var x mapping
		err := r.Scan(&x.user, &x.server)
		return x, err
	})
	if err != nil {
		return err
	}
	for _, x := range maps {
		user := "PUBLIC"
		if x.user != "" {
			user = pgx.Identifier{x.user}.Sanitize()
		}
		if _, err := c.Exec(ctx, "ALTER USER MAPPING FOR "+user+" SERVER "+pgx.Identifier{x.server}.Sanitize()+
			" OPTIONS (DROP password)"); err != nil {
			return err
		}
	}
	if err := revokeGrantsBeyondInit(ctx, c); err != nil {
		return err
	}
	if !open {
		return nil
	}
	return takeOverSuperusersObjects(ctx, c, role)
}

// grantsBeyondInit lists, as REVOKE statements, the grants on functions
// that PostgreSQL or an extension keeps from PUBLIC (those pg_init_privs
// records) to a grantee its initial privileges do not name, superusers and
// the owner apart: pg_ls_dir, pg_read_binary_file, get_raw_page,
// dblink_connect_u granted to an application role.
const grantsBeyondInit = `
SELECT DISTINCT format('REVOKE ALL ON FUNCTION %s FROM %s CASCADE', p.oid::regprocedure,
  CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END)
FROM pg_init_privs i
JOIN pg_proc p ON p.oid = i.objoid
CROSS JOIN LATERAL aclexplode(p.proacl) a
LEFT JOIN pg_authid r ON r.oid = a.grantee
WHERE i.classoid = 'pg_proc'::regclass AND i.objsubid = 0 AND a.grantee <> p.proowner
  AND (a.grantee = 0 OR (r.oid IS NOT NULL AND NOT r.rolsuper))
  AND NOT EXISTS (SELECT FROM aclexplode(i.initprivs) x WHERE x.grantee = a.grantee)`

// revokeGrantsBeyondInit revokes, in c's database, grantsBeyondInit: a
// function PostgreSQL keeps from PUBLIC reads the server's files or
// connects as its OS user (a member of an application role with EXECUTE
// on pg_read_binary_file read pg_authid's raw file, dead row versions with
// the source's password hashes and all), and the branch's role is a member
// of the application's roles. What the source granted such functions
// stays in the source; the branch holds what initdb and CREATE EXTENSION
// gave them.
func revokeGrantsBeyondInit(ctx context.Context, c *pgx.Conn) error {
	rows, err := c.Query(ctx, grantsBeyondInit)
	if err != nil {
		return err
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, q := range stmts {
		if _, err := c.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// superusersObjects lists, as ALTER statements giving them to the role $1,
// the application's objects a superuser owns in the current database:
// tables, views, materialized views, foreign tables, sequences of their
// own (those of a column follow their table), schemas, functions and
// procedures, and enum, domain and range types; never a system object
// (oid below FirstNormalObjectId, pg_catalog, information_schema) nor a
// member of an extension.
const superusersObjects = `
WITH su AS (SELECT oid FROM pg_roles WHERE rolsuper),
ext AS (SELECT classid, objid FROM pg_depend WHERE deptype = 'e')
SELECT format('ALTER %s %s OWNER TO %I', kind, obj, $1::text) FROM (
  SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
    WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END AS kind, c.oid::regclass::text AS obj, 1 AS ord
  FROM pg_class c
  WHERE c.relowner IN (SELECT oid FROM su) AND c.oid >= 16384 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
    AND c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
    AND (c.relkind <> 'S' OR NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
      AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
    AND NOT EXISTS (SELECT FROM ext WHERE classid = 'pg_class'::regclass AND objid = c.oid)
  UNION ALL
  SELECT 'SCHEMA', quote_ident(n.nspname), 0 FROM pg_namespace n
  WHERE n.nspowner IN (SELECT oid FROM su) AND n.oid >= 16384
    AND NOT EXISTS (SELECT FROM ext WHERE classid = 'pg_namespace'::regclass AND objid = n.oid)
  UNION ALL
  SELECT 'ROUTINE', p.oid::regprocedure::text, 2 FROM pg_proc p
  WHERE p.proowner IN (SELECT oid FROM su) AND p.oid >= 16384
    AND NOT EXISTS (SELECT FROM ext WHERE classid = 'pg_proc'::regclass AND objid = p.oid)
  UNION ALL
  SELECT 'TYPE', t.oid::regtype::text, 2 FROM pg_type t
  WHERE t.typowner IN (SELECT oid FROM su) AND t.oid >= 16384 AND t.typtype IN ('e', 'd', 'r')
    AND NOT EXISTS (SELECT FROM ext WHERE classid = 'pg_type'::regclass AND objid = t.oid)
) x ORDER BY ord, obj`

// takeOverSuperusersObjects gives role (the branch's) the application's
// objects a superuser of the source owns (superusersObjects): a branch's
// role is no superuser, and without them it could not ALTER, TRUNCATE or
// DROP the tables of an application whose migrations ran as postgres (the
// usual small setup). Giving an object away never adds power: a
// SECURITY DEFINER function of postgres runs as the branch's role from
// then on. An object whose owner cannot change (PostgreSQL refuses it)
// stays the superuser's, readable and writable through pg_read_all_data
// and pg_write_all_data.
func takeOverSuperusersObjects(ctx context.Context, c *pgx.Conn, role string) error {
	rows, err := c.Query(ctx, superusersObjects, role)
	if err != nil {
		return err
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, q := range stmts {
		_, _ = c.Exec(ctx, q) // see above: what cannot change stays as it was
	}
	// As in its URL's database (setUpRole), it creates schemas, and objects
	// in schema public (PostgreSQL 15 gives public to the database's owner).
	var db string
	var public bool
	if err := c.QueryRow(ctx, "SELECT current_database(), EXISTS (SELECT FROM pg_namespace WHERE nspname = 'public')").Scan(&db, &public); err != nil {
		return err
	}
	me := pgx.Identifier{role}.Sanitize()
	if _, err := c.Exec(ctx, "GRANT CREATE ON DATABASE "+pgx.Identifier{db}.Sanitize()+" TO "+me); err != nil {
		return err
	}
	if public {
		if _, err := c.Exec(ctx, "GRANT CREATE ON SCHEMA public TO "+me); err != nil {
			return err
		}
	}
	return nil
}
