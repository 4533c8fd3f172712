package pool

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/errs"
)

// Store is where templates live and where test copies are made: databases
// inside one server (database isolation, NewManager) or whole clusters, one
// per test (cluster isolation, implemented by the server package). The
// Manager does all its server-side work through it.
type Store interface {
	// Creator makes and drops test copies; name is the copy's name and
	// template the template's name.
	Creator
	// Recover runs once at start: it removes every test copy whose name
	// starts with testPrefix (a previous run's, state unknown) and, when
	// persist is set, returns the template records of prefix and a run
	// epoch that grows by one on every start.
	Recover(ctx context.Context, prefix, testPrefix string, persist bool) (recs []Record, epoch int, err error)
	// Save records a template's state ("initializing" or "finalized").
	Save(ctx context.Context, prefix string, r Record) error
	// Forget removes a template's record.
	Forget(ctx context.Context, prefix, hash string) error
	// TemplateExists reports whether template name exists.
	TemplateExists(ctx context.Context, name string) (bool, error)
	// CreateTemplate makes an empty template name owned by owner, as a
	// copy of root, replacing a leftover of the same name.
	CreateTemplate(ctx context.Context, name, owner, root string) error
	// FinalizeTemplate makes template name ready to be copied.
	FinalizeTemplate(ctx context.Context, name string) error
	// DropTemplate removes template name, even while clients use it.
	DropTemplate(ctx context.Context, name string) error
	// Endpoint says where clients reach the template or test copy name.
	Endpoint(name string) Endpoint
	// Ping checks that the store works.
	Ping(ctx context.Context) error
	// Close stops what the store runs besides test copies (templates being
	// initialized); they are cleaned up by the next Recover.
	Close(ctx context.Context) error
}

// Record is a template's persisted state.
type Record struct {
	Hash, Name, State string
}

// Endpoint is where a client reaches a database: Host and Port empty when
// it is on the server the API hands out by default, and the database's name
// on that server.
type Endpoint struct {
	Host     string
	Port     int
	Database string
}

// adminStore keeps templates and test databases in one server, reached
// over an admin connection pool; template state lives in a table of its
// admin database.
type adminStore struct {
	Creator
	admin  *pgxpool.Pool
	prefix string // set by Recover when test databases are tracked (tracked.go)
}

// NewAdminStore returns the Store of database isolation: templates and
// test databases inside the server of admin, test databases made by creator.
func NewAdminStore(admin *pgxpool.Pool, creator Creator) Store {
	return &adminStore{Creator: creator, admin: admin}
}

// stateTable keeps template state across restarts, in the admin database.
const stateTable = "pgfork_serve_templates"

// epochTable counts the starts of the server, per prefix.
const epochTable = "pgfork_serve_epochs"

// Sessions forwards to the creator's SessionCounter, so that pools of
// database isolation reclaim only databases seen without sessions.
func (s *adminStore) Sessions(ctx context.Context, names []string) (map[string]int, error) {
	sc, ok := s.Creator.(SessionCounter)
	if !ok {
		return nil, errs.New(errs.Unsupported, "the creator cannot count sessions")
	}
	return sc.Sessions(ctx, names)
}

func (s *adminStore) Recover(ctx context.Context, prefix, testPrefix string, persist bool) ([]Record, int, error) {
	var leftovers []string
	rows, err := s.admin.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", testPrefix)
	if err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot list databases")
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, 0, err
		}
		leftovers = append(leftovers, n)
	}
	rows.Close()
	for _, n := range leftovers {
		if err := dropForce(ctx, s.admin, n); err != nil {
			return nil, 0, err
		}
	}
	if !persist {
		return nil, 0, nil
	}
	if err := s.initTracking(ctx, prefix); err != nil {
		return nil, 0, err
	}
	if _, err := s.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+stateTable+` (
		prefix text NOT NULL, hash text NOT NULL, database text NOT NULL,
		state text NOT NULL, updated timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (prefix, hash))`); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot create the state table %s", stateTable)
	}
	if _, err := s.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+epochTable+` (
		prefix text PRIMARY KEY, epoch int NOT NULL)`); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot create the table %s", epochTable)
	}
	var epoch int
	if err := s.admin.QueryRow(ctx, `INSERT INTO `+epochTable+` (prefix, epoch) VALUES ($1, 1)
		ON CONFLICT (prefix) DO UPDATE SET epoch = `+epochTable+`.epoch + 1 RETURNING epoch`, prefix).Scan(&epoch); err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot count server starts")
	}
	var recs []Record
	rows, err = s.admin.Query(ctx, `SELECT hash, database, state FROM `+stateTable+` WHERE prefix = $1`, prefix)
	if err != nil {
		return nil, 0, errs.Wrap(errs.Internal, err, "cannot read template state")
	}
	for rows.Next() {
		var r Record
		if err := rows.Scan(&r.Hash, &r.Name, &r.State); err != nil {
			rows.Close()
			return nil, 0, err
		}
		recs = append(recs, r)
	}
	rows.Close()
	return recs, epoch, nil
}

func (s *adminStore) Save(ctx context.Context, prefix string, r Record) error {
	_, err := s.admin.Exec(ctx, `INSERT INTO `+stateTable+` (prefix, hash, database, state) VALUES ($1, $2, $3, $4)
		ON CONFLICT (prefix, hash) DO UPDATE SET database = excluded.database, state = excluded.state, updated = now()`,
		prefix, r.Hash, r.Name, r.State)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot save template state")
	}
	return nil
}

func (s *adminStore) Forget(ctx context.Context, prefix, hash string) error {
	_, err := s.admin.Exec(ctx, `DELETE FROM `+stateTable+` WHERE prefix = $1 AND hash = $2`, prefix, hash)
	return err
}

func (s *adminStore) TemplateExists(ctx context.Context, name string) (bool, error) {
	var exists bool
	err := s.admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	return exists, err
}

func (s *adminStore) CreateTemplate(ctx context.Context, name, owner, root string) error {
	if err := dropForce(ctx, s.admin, name); err != nil {
		return err
	}
	if _, err := s.admin.Exec(ctx, dbclone.CreateDatabaseSQL(name, root, owner)); err != nil {
		return classify(err, "cannot create template database %s", name)
	}
	return nil
}

// FinalizeTemplate locks the template against clients: it becomes owned by
// the server's own role and takes no connections, so no client can change
// what later test databases are copied from. (A superuser client could undo
// this; the managed cluster's default role is one, by design.) Where the
// server's role may not take the database over (an external server with a
// non-superuser admin role), it still refuses connections.
func (s *adminStore) FinalizeTemplate(ctx context.Context, name string) error {
	id := pgx.Identifier{name}.Sanitize()
	if _, err := s.admin.Exec(ctx, "ALTER DATABASE "+id+" OWNER TO CURRENT_USER"); err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" { // insufficient_privilege
			return classify(err, "cannot take over template database %s", name)
		}
	}
	if _, err := s.admin.Exec(ctx, "ALTER DATABASE "+id+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return classify(err, "cannot close template database %s to connections", name)
	}
	return nil
}

func (s *adminStore) DropTemplate(ctx context.Context, name string) error {
	return dropForce(ctx, s.admin, name)
}

func (s *adminStore) Endpoint(name string) Endpoint { return Endpoint{Database: name} }

func (s *adminStore) Ping(ctx context.Context) error { return s.admin.Ping(ctx) }

func (s *adminStore) Close(context.Context) error { return nil }

func dropForce(ctx context.Context, admin *pgxpool.Pool, name string) error {
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return classify(err, "cannot drop database %s", name)
	}
	return nil
}
