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
// makes the next start scrub again.
const scrubbedMark = "pgfork-credentials-scrubbed"

// scrubCredentials removes from a branch, in every database that accepts
// connections, the credentials of other systems that the source keeps in
// its catalogs and that the branch's role could read (pg_read_all_data
// reads every catalog): logical subscriptions (their connection strings
// name the publisher, often with a password; a subscription that ran in a
// branch would also take changes from the publisher's slot away from the
// source's own subscriber) are disabled, detached from their slot and
// dropped; the password option of every user mapping is dropped. Roles'
// passwords are setUpRole's. Branches run with no logical replication
// worker (branchSettings), so no subscription runs before this.
//
// sock reaches the branch's server over its private socket as the
// bootstrap superuser; db is the database it is connected to.
func (m *Manager) scrubCredentials(ctx context.Context, sock *instance.Instance, data string) error {
	if _, err := os.Lstat(filepath.Join(data, scrubbedMark)); err == nil {
		return nil
	}
	conn, err := pgx.Connect(ctx, sock.ConnString(m.o.SuperUser, "postgres"))
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname")
	var dbs []string
	if err == nil {
		dbs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	for _, db := range dbs {
		if err := m.scrubDatabase(ctx, sock.ConnString(m.o.SuperUser, db)); err != nil {
			return errs.Wrap(errs.KindOf(err), err, "database %q", db)
		}
	}
	if err := instance.WriteFileAs(filepath.Join(data, scrubbedMark), m.o.User, []byte("subscriptions and user mapping passwords removed by pgfork\n")); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// scrubDatabase is scrubCredentials in one database (url).
func (m *Manager) scrubDatabase(ctx context.Context, url string) error {
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
	return nil
}
