package logical

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/dbclone"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// userTables restricts a query on class c and namespace n to the user's
// permanent tables, which FOR ALL TABLES publishes.
const userTables = `c.relkind = 'r' AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp_%'`

// noIdentitySQL lists tables whose UPDATE and DELETE a publication would
// refuse: no replica identity (no primary key and the default identity,
// or REPLICA IDENTITY NOTHING).
const noIdentitySQL = `SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE ` + userTables + `
   AND (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)))
 ORDER BY 1 LIMIT 11`

// preflight checks everything the run needs before it creates anything.
func (r *run) preflight(ctx context.Context) error {
	o := r.o
	if _, running, _ := pgdata.Running(o.OldDir); !running {
		return errs.New(errs.Unsupported, "the old cluster is not running; an upgrade by logical replication works while it serves").WithPath(o.OldDir).
			WithHint("start it, or upgrade it stopped").WithCLI("or run without --logical")
	}
	if o.New.Major <= o.Old.Major {
		return errs.New(errs.Usage, "PostgreSQL %d is not newer than the old cluster's %d", o.New.Major, o.Old.Major).WithHint("upgrade to a newer major").WithCLI("--to")
	}
	var err error
	if r.ctl, err = pgdata.ReadControlData(ctx, o.Old.BinDir, o.OldDir, o.Old.Env); err != nil {
		return err
	}
	if err := r.connectOld(ctx); err != nil {
		return err
	}
	c := r.control
	var walLevel string
	if err := c.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read wal_level")
	}
	if walLevel != "logical" {
		return errs.New(errs.Unsupported, "the old cluster runs with wal_level = %s; logical replication needs wal_level = logical", walLevel).
			WithHint("run ALTER SYSTEM SET wal_level = logical on it and restart it (a restart: plan it), then run again; or upgrade it stopped").WithCLI("or run without --logical")
	}
	var subs int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_subscription").Scan(&subs); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read pg_subscription")
	}
	if subs > 0 {
		return errs.New(errs.Unsupported, "the old cluster is a subscriber (%d subscriptions); an upgrade by logical replication cannot carry a subscriber's state", subs).
			WithHint("upgrade it stopped").WithCLI("run without --logical")
	}
	// Tablespaces: pg_upgrade of the clone puts the new cluster's files in
	// the clone's copies of them, not beside the old cluster's in their
	// locations as an upgrade in place does; carrying them there is not
	// built, so the run refuses before it creates anything.
	var spcs string
	if err := c.QueryRow(ctx, "SELECT coalesce(string_agg(spcname, ', ' ORDER BY spcname), '') FROM pg_tablespace WHERE spcname NOT IN ('pg_default', 'pg_global')").Scan(&spcs); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read pg_tablespace")
	}
	if spcs != "" {
		return errs.New(errs.Unsupported, "the old cluster has tablespaces (%s); an upgrade by logical replication does not carry tablespaces yet", spcs).
			WithHint("upgrade it stopped: pg_upgrade puts the new cluster's files beside the old ones in each tablespace; or move their tables and indexes to pg_default (ALTER TABLE … SET TABLESPACE pg_default), drop the tablespaces and run again").
			WithCLI("run without --logical (--stop-old)")
	}
	var prepared int
	var gids string
	if err := c.QueryRow(ctx, "SELECT count(*), coalesce(string_agg(gid, ', ' ORDER BY gid), '') FROM pg_prepared_xacts").Scan(&prepared, &gids); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read pg_prepared_xacts")
	}
	if prepared > 0 {
		return errs.New(errs.Busy, "the old cluster has %d prepared transactions (%s): a logical slot cannot be created while they are open", prepared, gids).
			WithHint("COMMIT PREPARED or ROLLBACK PREPARED them, then run again")
	}
	if long := r.longXacts(ctx, o.MaxXactAge); long != "" {
		return errs.New(errs.Busy, "transactions older than %s run on the old cluster%s; creating a logical slot waits for them to end", o.MaxXactAge, long).
			WithHint("end them (COMMIT or ROLLBACK in their application, or pg_terminate_backend(pid)) or wait until they end, then run again")
	}
	var left []string
	rows, err := c.Query(ctx, `SELECT 'slot ' || slot_name FROM pg_replication_slots WHERE slot_name LIKE 'pgfork\_upgrade\_%'`)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read pg_replication_slots")
	}
	if left, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read pg_replication_slots")
	}
	rows, err = c.Query(ctx, `SELECT datname, oid FROM pg_database WHERE datallowconn AND datname <> 'template1' ORDER BY datname`)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	var name string
	var oid uint32
	if _, err := pgx.ForEachRow(rows, []any{&name, &oid}, func() error {
		r.dbs = append(r.dbs, &database{name: name, oid: oid, slot: fmt.Sprintf("%s%d", slotPfx, oid)})
		r.res.Databases = append(r.res.Databases, name)
		return nil
	}); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	n := len(r.dbs)
	if n == 0 {
		return errs.New(errs.Unsupported, "the old cluster has no database to replicate (only template0 and template1)").
			WithHint("upgrade it stopped").WithCLI("run without --logical")
	}
	// The clone streams WAL from the old cluster as this role, through a
	// replication connection: pg_hba.conf must let it in.
	if rc, err := pgconn.Connect(ctx, r.oldURL("postgres", "pgfork upgrade")+"&replication=true"); err != nil {
		return dbclone.SQLError(ctx, err, "the old cluster refuses a replication connection as %s through its socket; the clone streams WAL so", r.su).
			WithHint("let %s in for replication in its pg_hba.conf (local replication %s peer, or trust on a private socket) and reload it", r.su, r.su)
	} else {
		_ = rc.Close(ctx)
	}
	var freeSlots, freeSenders int
	if err := c.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots),
		current_setting('max_wal_senders')::int - (SELECT count(*) FROM pg_stat_replication)`).Scan(&freeSlots, &freeSenders); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read the replication settings")
	}
	if freeSlots < n+1 {
		return errs.New(errs.Unsupported, "the old cluster has %d free replication slots; the upgrade needs %d (one per database, %d, and one for the clone)", freeSlots, n+1, n).
			WithHint("raise max_replication_slots (ALTER SYSTEM, then a restart) or drop unused slots")
	}
	// With pg_walinspect only the databases written during the run are
	// subscribed (walscan.go), each through a WAL sender: how many is
	// known only then (checkSenders); here at least one besides the
	// clone's. Without it, every database.
	if r.scan.ok, err = r.scanAvailable(ctx); err != nil {
		return err
	}
	if r.scan.ok && freeSenders < 2 {
		return errs.New(errs.Unsupported, "the old cluster has %d free WAL senders; the upgrade needs one for the clone and one per database written during the run, at least 2", freeSenders).
			WithHint("raise max_wal_senders (ALTER SYSTEM, then a restart)")
	}
	if !r.scan.ok && freeSenders < n+1 {
		return errs.New(errs.Unsupported, "the old cluster has %d free WAL senders; the upgrade needs %d (one per database, %d, and one for the clone; with pg_walinspect, a contrib module of PostgreSQL 15+, only one per database written during the run)", freeSenders, n+1, n).
			WithHint("raise max_wal_senders (ALTER SYSTEM, then a restart), or install PostgreSQL's contrib modules on the old cluster's server")
	}
	// pgfork holds a connection to every database (its control connection
	// is open already); the application keeps the rest.
	var freeConns int
	if err := c.QueryRow(ctx, `SELECT current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')`).Scan(&freeConns); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot read max_connections")
	}
	if freeConns < n {
		return errs.New(errs.Unsupported, "the old cluster has %d free connections; the upgrade holds one per database, %d, beside the application's", freeConns, n).
			WithHint("raise max_connections to at least %d more than the application uses (ALTER SYSTEM, then a restart)", n)
	}
	if err := r.openOld(ctx); err != nil {
		return err
	}
	var noIdentity []string
	unlogged := 0
	for _, d := range r.dbs {
		var pubs int
		if err := d.old.QueryRow(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = $1", pubName).Scan(&pubs); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read pg_publication of database %q", d.name)
		}
		if pubs > 0 {
			left = append(left, fmt.Sprintf("publication %s in database %s", pubName, d.name))
		}
		rows, err := d.old.Query(ctx, noIdentitySQL)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the tables of database %q", d.name)
		}
		ts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the tables of database %q", d.name)
		}
		for _, t := range ts {
			noIdentity = append(noIdentity, d.name+": "+t)
		}
		var u int
		if err := d.old.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind = 'r' AND c.relpersistence = 'u'`).Scan(&u); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the tables of database %q", d.name)
		}
		unlogged += u
		// An unlogged sequence moves without WAL: the scan cannot see it,
		// and the clone's copy is reset. Its database is subscribed from
		// the start, so that the catch-up and the window copy its value.
		if err := d.old.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_class WHERE relkind = 'S' AND relpersistence = 'u'`).Scan(&d.unloggedSeqs); err != nil {
			return errs.Wrap(errs.Internal, err, "cannot read the sequences of database %q", d.name)
		}
	}
	if len(left) > 0 {
		return errs.New(errs.Exists, "the old cluster holds what an earlier upgrade by logical replication left: %s", strings.Join(left, ", ")).
			WithHint("drop them (pg_drop_replication_slot('NAME'); DROP PUBLICATION %s in each database named) and run again", pubName)
	}
	if len(noIdentity) > 0 {
		more := ""
		if len(noIdentity) > 10 {
			noIdentity, more = noIdentity[:10], " and more"
		}
		return errs.New(errs.Unsupported, "tables without a primary key or replica identity: %s%s; with a publication their UPDATE and DELETE would fail on the old cluster",
			strings.Join(noIdentity, ", "), more).
			WithHint("add a primary key, or ALTER TABLE ... REPLICA IDENTITY FULL (each update then logs the whole row), then run again")
	}
	if unlogged > 0 {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("%d unlogged tables arrive empty on the new cluster (they are not replicated)", unlogged))
	}
	return nil
}
