package dbclone

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/shell"
)

// A snapshot of database D named N is a database pgfork_snap_<h> (h: a hash
// of D and N, so any name fits in 63 bytes), closed to connections, made by
// the advisor's strategy, whose COMMENT holds the metadata as JSON. Beside it
// pgfork keeps a spare copy, pgfork_spare_<h>, so that a restore is two
// renames (Stellar's trick); the spare is refilled after each restore. The
// metadata lives in the server, so it survives restarts and every pgfork
// process sees it.
const (
	snapPrefix  = "pgfork_snap_"
	sparePrefix = "pgfork_spare_"
	oldPrefix   = "pgfork_old_"
)

// SnapshotInfo describes one snapshot.
type SnapshotInfo struct {
	Name     string    `json:"name"`     // the user's name for it
	Source   string    `json:"source"`   // the database it is a snapshot of
	Database string    `json:"database"` // the snapshot database (pgfork_snap_…)
	Spare    string    `json:"spare"`    // the spare copy (pgfork_spare_…)
	HasSpare bool      `json:"has_spare"`
	Created  time.Time `json:"created"`
	Size     int64     `json:"size"` // bytes (pg_database_size of the source)
	Strategy Strategy  `json:"strategy"`
	Owner    string    `json:"owner"` // the source database's owner
}

type snapMeta struct {
	Kind     string    `json:"pgfork"` // "snapshot" or "spare"
	Version  int       `json:"v"`
	Name     string    `json:"name,omitempty"`
	Source   string    `json:"source,omitempty"`
	Created  time.Time `json:"created,omitzero"`
	Size     int64     `json:"size,omitempty"`
	Strategy Strategy  `json:"strategy,omitempty"`
	Owner    string    `json:"owner,omitempty"`
	Snapshot string    `json:"snapshot,omitempty"` // spare: its snapshot database
}

func snapHash(db, name string) string {
	h := sha256.Sum256([]byte(db + "\x00" + name))
	return hex.EncodeToString(h[:10])
}

// SnapshotDatabase returns the name of the database holding snapshot name of db.
func SnapshotDatabase(db, name string) string { return snapPrefix + snapHash(db, name) }

func spareDatabase(db, name string) string { return sparePrefix + snapHash(db, name) }

// DefaultSnapshotName is the name Snapshot gives when none is given: the
// UTC time to the millisecond, so names sort by age.
func DefaultSnapshotName(t time.Time) string { return t.UTC().Format("20060102-150405.000") }

// Snapshot takes a snapshot called name (default: the time) of database db
// with opts' strategy (auto: the advisor's). Like any copy, it needs db to
// have no other sessions (see CreateOptions.WaitTimeout and Force). It does
// not make the spare: call Refill for that (the CLI does, right after).
func Snapshot(ctx context.Context, conn *pgx.Conn, db, name string, opts CreateOptions) (*SnapshotInfo, *Result, error) {
	if err := ValidateName(db); err != nil {
		return nil, nil, err
	}
	if name == "" {
		name = DefaultSnapshotName(time.Now())
	}
	if err := ValidateName(name); err != nil {
		return nil, nil, err
	}
	var owner string
	var size int64
	err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(datdba)::text, pg_database_size(oid) FROM pg_database WHERE datname = $1`, db).Scan(&owner, &size)
	if err == pgx.ErrNoRows {
		return nil, nil, errs.New(errs.NotFound, "database %q does not exist", db).WithHint("list databases with: psql -l")
	}
	if err != nil {
		return nil, nil, sqlErr(ctx, err, "cannot read database %q", db)
	}
	info := &SnapshotInfo{Name: name, Source: db, Database: SnapshotDatabase(db, name), Spare: spareDatabase(db, name),
		Created: time.Now().UTC(), Size: size, Owner: owner}
	if ex, err := findSnapshots(ctx, conn, db, name); err != nil {
		return nil, nil, err
	} else if len(ex) > 0 {
		return nil, nil, errs.New(errs.Exists, "database %q already has a snapshot named %q", db, name).
			WithHint("choose another name, or remove that snapshot").WithCLI("remove it with: pgfork db rm-snapshot --db %s %s", shell.Quote(db), shell.Quote(name))
	}
	// The metadata is written with the strategy, in the transaction that
	// renames the finished copy into place (see finishWork): a snapshot
	// database without metadata never exists.
	opts.NoConnections = true
	opts.Comment = ""
	opts.commentFor = func(st Strategy) string {
		b, _ := json.Marshal(snapMeta{Kind: "snapshot", Version: 1, Name: name, Source: db, Created: info.Created, Size: size, Strategy: st, Owner: owner})
		return string(b)
	}
	res, err := Create(ctx, conn, info.Database, db, opts)
	if err != nil {
		if errs.KindOf(err) == errs.Exists {
			return nil, nil, errs.Wrap(errs.Exists, err, "snapshot %q of %q exists without its metadata", name, db).
				WithHint("drop database %s, or choose another snapshot name", quote(info.Database))
		}
		return nil, nil, err
	}
	info.Strategy = res.Strategy
	return info, res, nil
}

// Snapshots lists the snapshots of database db (all databases when db is
// ""), oldest first.
func Snapshots(ctx context.Context, conn *pgx.Conn, db string) ([]SnapshotInfo, error) {
	if db != "" {
		if err := ValidateName(db); err != nil {
			return nil, err
		}
	}
	if _, err := Sweep(ctx, conn); err != nil {
		return nil, err
	}
	return findSnapshots(ctx, conn, db, "")
}

func findSnapshots(ctx context.Context, conn *pgx.Conn, db, name string) ([]SnapshotInfo, error) {
	rows, err := conn.Query(ctx, `SELECT datname::text, coalesce(shobj_description(oid, 'pg_database'), '')
		FROM pg_database WHERE datname LIKE 'pgfork\_snap\_%' OR datname LIKE 'pgfork\_spare\_%'`)
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot list snapshots")
	}
	type row struct{ name, comment string }
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.name, &x.comment)
	})
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot list snapshots")
	}
	spares := map[string]bool{}
	for _, r := range all {
		var m snapMeta
		if strings.HasPrefix(r.name, sparePrefix) && json.Unmarshal([]byte(r.comment), &m) == nil && m.Kind == "spare" {
			spares[m.Snapshot] = true
		}
	}
	var out []SnapshotInfo
	for _, r := range all {
		var m snapMeta
		if !strings.HasPrefix(r.name, snapPrefix) || json.Unmarshal([]byte(r.comment), &m) != nil || m.Kind != "snapshot" {
			continue
		}
		if (db != "" && m.Source != db) || (name != "" && m.Name != name) {
			continue
		}
		out = append(out, SnapshotInfo{Name: m.Name, Source: m.Source, Database: r.name, Spare: spareDatabase(m.Source, m.Name),
			HasSpare: spares[r.name], Created: m.Created, Size: m.Size, Strategy: m.Strategy, Owner: m.Owner})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// FindSnapshot returns snapshot name of db, or db's latest when name is "".
func FindSnapshot(ctx context.Context, conn *pgx.Conn, db, name string) (*SnapshotInfo, error) {
	if err := ValidateName(db); err != nil {
		return nil, err
	}
	if name != "" {
		if err := ValidateName(name); err != nil {
			return nil, err
		}
	}
	list, err := findSnapshots(ctx, conn, db, name)
	if err != nil {
		return nil, err
	}
	if len(list) == 0 {
		if name != "" {
			return nil, errs.New(errs.NotFound, "database %q has no snapshot named %q", db, name).
				WithCLI("list them with: pgfork db snapshots %s", shell.Quote(db))
		}
		return nil, errs.New(errs.NotFound, "database %q has no snapshots", db).
			WithCLI("take one with: pgfork db snapshot %s", shell.Quote(db))
	}
	s := list[len(list)-1]
	return &s, nil
}

// Refill (re)creates the spare copy of snapshot s, if it is missing.
func Refill(ctx context.Context, conn *pgx.Conn, s *SnapshotInfo, opts CreateOptions) (*Result, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, s.Spare).Scan(&exists); err != nil {
		return nil, sqlErr(ctx, err, "cannot look for the spare of snapshot %q", s.Name)
	}
	if exists {
		s.HasSpare = true
		return nil, nil
	}
	opts.NoConnections = true
	b, _ := json.Marshal(snapMeta{Kind: "spare", Version: 1, Snapshot: s.Database})
	opts.Comment, opts.commentFor = string(b), nil
	opts.Force = false // nobody may connect to a snapshot
	res, err := Create(ctx, conn, s.Spare, s.Database, opts)
	if err != nil {
		return nil, err
	}
	s.HasSpare = true
	return res, nil
}

// RestoreOptions shape Restore.
type RestoreOptions struct {
	// Create shapes the copies made (the spare when it is missing, and the
	// refill); its Force and WaitTimeout apply to sessions on the database
	// being replaced.
	Create CreateOptions
	// NoRefill leaves the snapshot without a spare after the restore (the
	// next restore then copies first).
	NoRefill bool
}

// RestoreResult describes a restore.
type RestoreResult struct {
	Snapshot SnapshotInfo `json:"snapshot"`
	// Swap is how long the database was unavailable: the renames.
	Swap time.Duration `json:"swap_ns"`
	// Elapsed is the whole restore, refill excluded.
	Elapsed time.Duration `json:"elapsed_ns"`
	// CopiedFirst is true when there was no spare and one was made first.
	CopiedFirst bool      `json:"copied_first,omitempty"`
	Terminated  []Session `json:"terminated,omitempty"`
	// Notes are things the user should know (e.g. an owner not restored).
	Notes []string `json:"notes,omitempty"`
}

// Restore replaces database db by the content of its snapshot name (latest
// when ""): the snapshot's spare copy is renamed into place and the old
// database dropped. Sessions on db make it fail with errs.Busy naming them,
// unless opts.Create.Force (after WaitTimeout). It does not refill the
// spare: call Refill afterwards (the CLI does unless --no-refill).
func Restore(ctx context.Context, conn *pgx.Conn, db, name string, opts RestoreOptions) (*RestoreResult, error) {
	start := time.Now()
	s, err := FindSnapshot(ctx, conn, db, name)
	if err != nil {
		return nil, err
	}
	res := &RestoreResult{}
	if !s.HasSpare {
		if _, err := Refill(ctx, conn, s, opts.Create); err != nil {
			return nil, err
		}
		res.CopiedFirst = true
	}
	var exists bool
	var cur string
	if err := conn.QueryRow(ctx, `SELECT current_database()::text, EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&cur, &exists); err != nil {
		return nil, sqlErr(ctx, err, "cannot look up database %q", db)
	}
	if cur == db {
		return nil, errs.New(errs.Usage, "cannot restore database %q while connected to it", db).
			WithHint("connect to another database (e.g. postgres) to restore it")
	}
	old := fmt.Sprintf("%s%s_%06x", oldPrefix, snapHash(db, s.Name), rand.IntN(1<<24))
	for attempt := 0; ; attempt++ {
		if exists {
			term, err := clearTemplate(ctx, conn, db, time.Now().Add(opts.Create.WaitTimeout), opts.Create.Force)
			res.Terminated = append(res.Terminated, term...)
			if err != nil {
				if errs.KindOf(err) == errs.Busy {
					return nil, errs.Wrap(errs.Busy, err, "cannot restore %q", db).
						WithHint("close those sessions, or ask for them to be terminated").WithCLI("pass --force to terminate them")
				}
				return nil, err
			}
		}
		t0 := time.Now()
		err := swap(ctx, conn, db, s, old, exists)
		if err == nil {
			res.Swap = time.Since(t0)
			break
		}
		if InUse(err) && opts.Create.Force && attempt < 10 {
			continue
		}
		if InUse(err) {
			sess, _ := Sessions(ctx, conn, db)
			return nil, busyErr(db, sess, err)
		}
		return nil, sqlErr(ctx, err, "cannot swap snapshot %q into database %q", s.Name, db)
	}
	s.HasSpare = false
	if s.Owner != "" {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+quote(db)+" OWNER TO "+quote(s.Owner)); err != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("could not give %q back to its owner %q: %v", db, s.Owner, err))
		}
	}
	if exists {
		if err := Drop(ctx, conn, old, true); err != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("the old copy of %q is kept as %q: %v", db, old, err))
		}
	}
	res.Snapshot = *s
	res.Elapsed = time.Since(start)
	return res, nil
}

// swap renames db away and the spare into its place, in one transaction.
func swap(ctx context.Context, conn *pgx.Conn, db string, s *SnapshotInfo, old string, exists bool) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if exists {
		if _, err := tx.Exec(ctx, "ALTER DATABASE "+quote(db)+" RENAME TO "+quote(old)); err != nil {
			return err
		}
	}
	for _, q := range []string{
		"ALTER DATABASE " + quote(s.Spare) + " RENAME TO " + quote(db),
		"ALTER DATABASE " + quote(db) + " ALLOW_CONNECTIONS true",
		"COMMENT ON DATABASE " + quote(db) + " IS NULL",
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// RemoveSnapshot drops snapshot name of db and its spare.
func RemoveSnapshot(ctx context.Context, conn *pgx.Conn, db, name string) (*SnapshotInfo, error) {
	if name == "" {
		return nil, errs.New(errs.Usage, "which snapshot? give its name").WithCLI("list them with: pgfork db snapshots")
	}
	if _, err := Sweep(ctx, conn); err != nil {
		return nil, err
	}
	var list []SnapshotInfo
	var err error
	if db == "" {
		if err := ValidateName(name); err != nil {
			return nil, err
		}
		list, err = findSnapshots(ctx, conn, "", name)
	} else {
		var s *SnapshotInfo
		if s, err = FindSnapshot(ctx, conn, db, name); err == nil {
			list = []SnapshotInfo{*s}
		}
	}
	if err != nil {
		return nil, err
	}
	switch len(list) {
	case 0:
		return nil, errs.New(errs.NotFound, "no snapshot named %q", name).WithCLI("list them with: pgfork db snapshots")
	case 1:
	default:
		var srcs []string
		for _, s := range list {
			srcs = append(srcs, fmt.Sprintf("%q", s.Source))
		}
		return nil, errs.New(errs.Usage, "snapshot name %q is used by several databases: %s", name, strings.Join(srcs, ", ")).
			WithHint("name the database too").WithCLI("say which with --db DB")
	}
	s := list[0]
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+quote(s.Spare)+" WITH (FORCE)"); err != nil {
		return nil, sqlErr(ctx, err, "cannot drop the spare of snapshot %q", name)
	}
	if err := Drop(ctx, conn, s.Database, true); err != nil {
		return nil, err
	}
	return &s, nil
}
