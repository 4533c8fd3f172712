// Package dbclone copies databases inside a running PostgreSQL server with
// CREATE DATABASE … TEMPLATE, choosing the strategy that is fastest for the
// template and the server: WAL_LOG (the default since PostgreSQL 15: every
// block goes through shared buffers and into WAL), FILE_COPY (copies files
// but forces two checkpoints, whose cost grows with shared_buffers and dirty
// data) or clone (FILE_COPY with PostgreSQL 18's file_copy_method = clone,
// which shares blocks on a copy-on-write filesystem).
//
// It also keeps snapshots of databases inside the server (see Snapshot and
// Restore). Every identifier is quoted; names are validated before any SQL
// runs. Functions take a *pgx.Conn that must not be connected to the template
// (or, for Restore, the database being replaced).
package dbclone

import (
	"context"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/internal/errs"
)

// Strategy is how CREATE DATABASE copies the template.
type Strategy string

// Strategies. Auto lets the advisor choose.
const (
	Auto     Strategy = "auto"
	WalLog   Strategy = "wal_log"
	FileCopy Strategy = "file_copy"
	Clone    Strategy = "clone"
)

// Strategies lists the fixed strategies, in the order the advisor reports them.
var Strategies = []Strategy{WalLog, FileCopy, Clone}

// ParseStrategy parses a strategy name as given on the command line.
func ParseStrategy(s string) (Strategy, error) {
	switch st := Strategy(strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))); st {
	case "", Auto:
		return Auto, nil
	case WalLog, FileCopy, Clone:
		return st, nil
	}
	return "", errs.New(errs.Usage, "unknown strategy %q", s).WithHint("use one of auto, wal_log, file_copy, clone")
}

// MaxNameBytes is the longest name PostgreSQL keeps (NAMEDATALEN-1). Longer
// names would be silently truncated by the server, so they are refused.
const MaxNameBytes = 63

// ValidateName checks a database or role name before any SQL runs: not
// empty, at most 63 bytes, valid UTF-8, no NUL. Any other character
// (spaces, quotes, mixed case, unicode) is fine: names are always quoted.
func ValidateName(name string) error {
	switch {
	case name == "":
		return errs.New(errs.Usage, "empty database name").WithHint("give a name of 1 to %d bytes", MaxNameBytes)
	case len(name) > MaxNameBytes:
		return errs.New(errs.Usage, "name %q is %d bytes long; PostgreSQL keeps at most %d bytes", name, len(name), MaxNameBytes).
			WithHint("use a shorter name (unicode characters take 2-4 bytes each)")
	case strings.ContainsRune(name, 0):
		return errs.New(errs.Usage, "name %q contains a NUL byte", name).WithHint("remove it")
	case !utf8.ValidString(name):
		return errs.New(errs.Usage, "name %q is not valid UTF-8", name).WithHint("use a UTF-8 name")
	}
	return nil
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// Target is what the advisor knows of a server.
type Target struct {
	// Version is the major version (server_version_num / 10000).
	Version int `json:"version"`
	// VersionNum is server_version_num.
	VersionNum int `json:"version_num"`
	// SharedBuffers in bytes.
	SharedBuffers int64 `json:"shared_buffers"`
	// Fsync is the server's fsync setting.
	Fsync bool `json:"fsync"`
	// CanClone says the data directory is on a filesystem that shares
	// blocks (reflink): known for managed clusters, told by the user otherwise.
	CanClone bool `json:"can_clone"`
	// FileCopyMethod is file_copy_method's value ("" before PostgreSQL 18)
	// and FileCopyMethodContext its pg_settings.context ("user" when a
	// session may SET it).
	FileCopyMethod        string `json:"file_copy_method,omitempty"`
	FileCopyMethodContext string `json:"file_copy_method_context,omitempty"`
	// SystemID is the cluster's system identifier when the role may read it
	// (pg_control_system), else 0.
	SystemID uint64 `json:"system_id,omitempty"`
	// DataDir is data_directory when the role may read it.
	DataDir string `json:"data_dir,omitempty"`

	// dirtySQL counts dirty buffers on the connection Inspect used (see
	// dirtyQuery), so that Advise needs one round trip; dirtySource says how.
	dirtySQL, dirtySource string
}

// Inspect reads what the advisor needs from the server conn is connected to.
// canClone says whether the data directory's filesystem can share blocks.
func Inspect(ctx context.Context, conn *pgx.Conn, canClone bool) (*Target, error) {
	t := &Target{CanClone: canClone}
	var fsync string
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int,
		(SELECT setting::bigint FROM pg_settings WHERE name = 'shared_buffers') * current_setting('block_size')::bigint,
		current_setting('fsync'),
		coalesce((SELECT setting FROM pg_settings WHERE name = 'file_copy_method'), ''),
		coalesce((SELECT context FROM pg_settings WHERE name = 'file_copy_method'), ''),
		coalesce((SELECT setting FROM pg_settings WHERE name = 'data_directory'), '')`).
		Scan(&t.VersionNum, &t.SharedBuffers, &fsync, &t.FileCopyMethod, &t.FileCopyMethodContext, &t.DataDir)
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot inspect the server")
	}
	t.Version = t.VersionNum / 10000
	t.Fsync = fsync == "on"
	t.dirtySQL, t.dirtySource = dirtyQuery(ctx, conn, t)
	// pg_control_system() is restricted to superusers by default: best effort.
	var sysid int64
	if err := conn.QueryRow(ctx, `SELECT system_identifier FROM pg_control_system()`).Scan(&sysid); err == nil {
		t.SystemID = uint64(sysid)
	} else if ctx.Err() != nil {
		return nil, errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted")
	}
	return t, nil
}

// CreateOptions shape Create.
type CreateOptions struct {
	// Strategy to use; "" or Auto asks the advisor.
	Strategy Strategy
	// Owner of the new database; "" keeps the server's default (the
	// connected role).
	Owner string
	// Force terminates other sessions on the template (after WaitTimeout).
	Force bool
	// WaitTimeout is how long to wait for other sessions on the template to
	// go away before failing (or, with Force, terminating them). Without
	// Force it is at least Grace, for backends of clients that just left.
	WaitTimeout time.Duration
	// Target is the server as seen by Inspect; nil: inspect now (without clone).
	Target *Target
	// Calibration holds the advisor's constants; nil: the built-in ones.
	Calibration *Calibration
	// Learning, when set, scales the advisor's estimates by what earlier
	// creations took, and records what this one takes (with a fixed
	// Strategy too: the model's estimate is computed for the comparison).
	Learning *Learning
	// Comment, when set, is stored with COMMENT ON DATABASE.
	Comment string
	// NoConnections marks the new database ALLOW_CONNECTIONS false.
	NoConnections bool
	// commentFor, when set, gives the comment once the strategy is known
	// (snapshots record it); it overrides Comment.
	commentFor func(Strategy) string
}

// Result describes a database Create made.
type Result struct {
	Name     string   `json:"name"`
	Template string   `json:"template"`
	Strategy Strategy `json:"strategy"` // the one used
	// Plain is true when the server (before PostgreSQL 15) has no STRATEGY
	// option and a plain CREATE DATABASE (a file copy) ran.
	Plain   bool          `json:"plain,omitempty"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// Terminated lists the sessions Force terminated.
	Terminated []Session `json:"terminated,omitempty"`
	// Advice is the advisor's reasoning when Strategy was Auto.
	Advice *Advice `json:"advice,omitempty"`
}

// Create makes database name as a copy of template inside the server conn
// is connected to (conn must not be connected to template). It checks names,
// privileges and existence first, waits for (or with Force terminates) other
// sessions on the template, and picks the strategy with the advisor when
// opts.Strategy is Auto.
func Create(ctx context.Context, conn *pgx.Conn, name, template string, opts CreateOptions) (*Result, error) {
	start := time.Now()
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := ValidateName(template); err != nil {
		return nil, err
	}
	if opts.Owner != "" {
		if err := ValidateName(opts.Owner); err != nil {
			return nil, err
		}
	}
	if opts.Strategy == "" {
		opts.Strategy = Auto
	}
	if _, err := ParseStrategy(string(opts.Strategy)); err != nil {
		return nil, err
	}
	t := opts.Target
	if t == nil {
		var err error
		if t, err = Inspect(ctx, conn, false); err != nil {
			return nil, err
		}
	}
	if err := checkCreate(ctx, conn, name, template); err != nil {
		return nil, err
	}
	res := &Result{Name: name, Template: template, Strategy: opts.Strategy}
	var adv *Advice
	if opts.Strategy == Auto || opts.Learning != nil {
		var err error
		if adv, err = AdviseLearned(ctx, conn, template, t, opts.Calibration, opts.Learning); err != nil {
			return nil, err
		}
	}
	if opts.Strategy == Auto {
		res.Advice, res.Strategy = adv, adv.Choice
	}
	if err := supported(res.Strategy, t); err != nil {
		return nil, err
	}
	res.Plain = t.Version < 15

	if _, err := Sweep(ctx, conn); err != nil {
		return nil, err
	}
	work, err := startWork(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer unlockWork(ctx, conn, work)
	var copied time.Duration // the CREATE DATABASE that succeeded
	deadline := time.Now().Add(opts.WaitTimeout)
	for attempt := 0; ; attempt++ {
		term, err := clearTemplate(ctx, conn, template, deadline, opts.Force)
		res.Terminated = append(res.Terminated, term...)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		err = execCreate(ctx, conn, work, template, res.Strategy, opts, t)
		if err == nil {
			copied = time.Since(t0)
			break
		}
		// An interrupted CREATE DATABASE may still have committed.
		dropWork(ctx, conn, work)
		// A session connected between our check and the CREATE: go round
		// again while time remains (or Force can act).
		if InUse(err) && attempt < 20 && (opts.Force || time.Now().Before(deadline)) {
			continue
		}
		return nil, createErr(ctx, conn, err, name, template, res.Strategy)
	}
	if err := finishWork(ctx, conn, work, name, res.Strategy, opts); err != nil {
		dropWork(ctx, conn, work)
		return nil, err
	}
	if adv != nil && !res.Plain {
		for _, e := range adv.Estimates {
			if e.Strategy == res.Strategy {
				opts.Learning.Observe(adv.Calibration, res.Strategy, adv.TemplateBytes, e.Model, copied)
			}
		}
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// finishWork gives the copy work its comment and connection setting and
// renames it to name, in one transaction. Once the copy exists it runs to
// the end even if ctx is cancelled (it takes milliseconds), so an
// interrupted Create either made name completely or made nothing.
func finishWork(ctx context.Context, conn *pgx.Conn, work, name string, s Strategy, opts CreateOptions) error {
	comment := opts.Comment
	if opts.commentFor != nil {
		comment = opts.commentFor(s)
	}
	fctx := context.WithoutCancel(ctx)
	tx, err := conn.Begin(fctx)
	if err != nil {
		return sqlErr(ctx, err, "cannot finish database %q", name)
	}
	defer func() { _ = tx.Rollback(fctx) }()
	if comment != "" {
		if _, err := tx.Exec(fctx, "COMMENT ON DATABASE "+quote(work)+" IS "+literal(comment)); err != nil {
			return sqlErr(ctx, err, "cannot comment database %q", name)
		}
	}
	if opts.NoConnections {
		if _, err := tx.Exec(fctx, "ALTER DATABASE "+quote(work)+" ALLOW_CONNECTIONS false"); err != nil {
			return sqlErr(ctx, err, "cannot close database %q to connections", name)
		}
	}
	if _, err := tx.Exec(fctx, "ALTER DATABASE "+quote(work)+" RENAME TO "+quote(name)); err != nil {
		if k, _ := SQLKind(err); k == errs.Exists {
			return errs.Wrap(errs.Exists, err, "database %q already exists", name).WithHint("choose another name, or drop it first")
		}
		return sqlErr(ctx, err, "cannot rename the copy to %q", name)
	}
	if err := tx.Commit(fctx); err != nil {
		if k, _ := SQLKind(err); k == errs.Exists {
			return errs.Wrap(errs.Exists, err, "database %q already exists", name).WithHint("choose another name, or drop it first")
		}
		return sqlErr(ctx, err, "cannot finish database %q", name)
	}
	return nil
}

// literal quotes a string as an SQL literal (COMMENT ON takes no parameters).
func literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// supported says whether strategy s can run on t.
func supported(s Strategy, t *Target) error {
	switch s {
	case WalLog:
		if t.Version < 15 {
			return errs.New(errs.Unsupported, "strategy wal_log needs PostgreSQL 15 or later; this server is %d", t.Version).
				WithHint("use strategy file_copy (what CREATE DATABASE does before 15) or auto").WithCLI("--strategy file_copy")
		}
	case Clone:
		if t.Version < 18 {
			return errs.New(errs.Unsupported, "strategy clone needs PostgreSQL 18 or later (file_copy_method); this server is %d", t.Version).
				WithHint("use strategy auto, file_copy or wal_log").WithCLI("--strategy auto")
		}
		if !t.CanClone {
			return errs.New(errs.Unsupported, "strategy clone needs a data directory on a filesystem that shares blocks (XFS with reflink, btrfs, ZFS 2.2+); pgfork does not know that this server's does").
				WithHint("if it does, say that it can clone; else use strategy auto").WithCLI("--can-clone, or --strategy auto")
		}
		if t.FileCopyMethod != "clone" && !settable(t.FileCopyMethodContext) {
			return errs.New(errs.Unsupported, "file_copy_method is %q and this role cannot SET it (context %s)", t.FileCopyMethod, t.FileCopyMethodContext).
				WithHint("set file_copy_method = clone in the server's configuration and reload it")
		}
	}
	return nil
}

func settable(context string) bool { return context == "user" }

// CreateDatabaseSQL returns `CREATE DATABASE name TEMPLATE template [OWNER
// owner]` with every identifier quoted: the one place this statement is
// built. Callers append a STRATEGY clause when they choose one.
func CreateDatabaseSQL(name, template, owner string) string {
	sql := "CREATE DATABASE " + quote(name) + " TEMPLATE " + quote(template)
	if owner != "" {
		sql += " OWNER " + quote(owner)
	}
	return sql
}

// execCreate runs CREATE DATABASE with the strategy's options.
func execCreate(ctx context.Context, conn *pgx.Conn, name, template string, s Strategy, opts CreateOptions, t *Target) error {
	var b strings.Builder
	b.WriteString(CreateDatabaseSQL(name, template, opts.Owner))
	if t.Version >= 15 {
		switch s {
		case WalLog:
			b.WriteString(" STRATEGY WAL_LOG")
		case FileCopy, Clone:
			b.WriteString(" STRATEGY FILE_COPY")
		}
	}
	// On 18+, make file_copy and clone mean what they say whatever the
	// server's default file_copy_method is.
	if t.Version >= 18 && (s == FileCopy || s == Clone) {
		want := "copy"
		if s == Clone {
			want = "clone"
		}
		if t.FileCopyMethod != want && settable(t.FileCopyMethodContext) {
			if _, err := conn.Exec(ctx, "SET file_copy_method = "+want); err != nil {
				return err
			}
			defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "RESET file_copy_method") }()
		}
	}
	_, err := conn.Exec(ctx, b.String())
	return err
}

// checkCreate checks privilege and existence so that errors name the object.
func checkCreate(ctx context.Context, conn *pgx.Conn, name, template string) error {
	var (
		role                    string
		canCreate, nameExists   bool
		tmplExists, tmplAllowed bool
	)
	err := conn.QueryRow(ctx, `SELECT current_user::text,
		(SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user),
		EXISTS (SELECT 1 FROM pg_database WHERE datname = $1),
		EXISTS (SELECT 1 FROM pg_database WHERE datname = $2),
		coalesce((SELECT datistemplate OR pg_has_role(datdba, 'MEMBER')
		            OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
		          FROM pg_database WHERE datname = $2), false)`, name, template).
		Scan(&role, &canCreate, &nameExists, &tmplExists, &tmplAllowed)
	if err != nil {
		return sqlErr(ctx, err, "cannot check database %q", name)
	}
	switch {
	case !canCreate:
		return errs.New(errs.Permission, "role %q may not create databases (no CREATEDB)", role).
			WithHint("connect as a role with CREATEDB, or have a superuser run: ALTER ROLE %s CREATEDB", quote(role))
	case !tmplExists:
		return errs.New(errs.NotFound, "template database %q does not exist", template).
			WithHint("list databases with: psql -l")
	case nameExists:
		return errs.New(errs.Exists, "database %q already exists", name).
			WithHint("choose another name, or drop it first")
	case !tmplAllowed:
		return errs.New(errs.Permission, "role %q may not copy database %q: it is not a template and the role does not own it", role, template).
			WithHint("have its owner or a superuser run: ALTER DATABASE %s IS_TEMPLATE true", quote(template))
	}
	return nil
}

// createErr turns a CREATE DATABASE failure into a typed error.
func createErr(ctx context.Context, conn *pgx.Conn, err error, name, template string, s Strategy) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || ctx.Err() != nil {
		return sqlErr(ctx, err, "cannot create database %q from %q", name, template)
	}
	kind, _ := SQLKind(err)
	switch {
	case kind == errs.Exists:
		return errs.Wrap(errs.Exists, err, "database %q already exists", name).WithHint("choose another name, or drop it first")
	case UndefinedDatabase(err):
		return errs.Wrap(errs.NotFound, err, "template database %q does not exist", template)
	case kind == errs.NotFound:
		return errs.Wrap(errs.NotFound, err, "cannot create database %q", name).WithHint("check that the owner role exists")
	case InsufficientPrivilege(err):
		return sqlErr(ctx, err, "cannot create database %q from %q", name, template).
			WithHint("the role needs CREATEDB, and must own the template or the template must be IS_TEMPLATE; to give a database away the role must be a member of the owner role")
	case InUse(err):
		sess, _ := Sessions(ctx, conn, template)
		return busyErr(template, sess, err)
	case kind == errs.NoSpace:
		return errs.Wrap(errs.NoSpace, err, "out of disk space creating database %q", name).
			WithHint("free space on the server's data directory")
	}
	if s == Clone && (strings.Contains(pe.Message, "clone") || strings.Contains(pe.Message, "reflink")) {
		return errs.Wrap(errs.Unsupported, err, "the server cannot clone files for database %q", name).
			WithHint("its data directory's filesystem does not share blocks: use strategy auto or file_copy").WithCLI("--strategy auto")
	}
	return sqlErr(ctx, err, "cannot create database %q from %q", name, template)
}

// sqlErr wraps a (non-nil) server or connection error by SQLError.
func sqlErr(ctx context.Context, err error, format string, args ...any) *errs.Error {
	return SQLError(ctx, err, format, args...)
}

// Drop drops database name (which must exist) after terminating its
// sessions when force is set. Missing databases are errs.NotFound.
func Drop(ctx context.Context, conn *pgx.Conn, name string, force bool) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	q := "DROP DATABASE " + quote(name)
	if force {
		q += " WITH (FORCE)"
	}
	if _, err := conn.Exec(ctx, q); err != nil {
		switch {
		case UndefinedDatabase(err):
			return errs.Wrap(errs.NotFound, err, "database %q does not exist", name)
		case InUse(err):
			sess, _ := Sessions(ctx, conn, name)
			return busyErr(name, sess, err)
		}
		return sqlErr(ctx, err, "cannot drop database %q", name)
	}
	return nil
}

// CreateDirect runs one CREATE DATABASE name TEMPLATE template [OWNER
// owner] with strategy s (not Auto) on conn, as Create's copy step does:
// no checks, no work-in-progress name, no wait for sessions on the
// template, no advisor. It is for callers that own name and chose s
// already (a pool of test databases, whose names nobody else takes and
// whose leftovers it drops at start); Create gives the better errors.
// Errors are classified by SQLError: sessions on the template are
// errs.Busy, an existing name errs.Exists.
func CreateDirect(ctx context.Context, conn *pgx.Conn, name, template, owner string, s Strategy, t *Target) error {
	names := []string{name, template}
	if owner != "" {
		names = append(names, owner)
	}
	for _, n := range names {
		if err := ValidateName(n); err != nil {
			return err
		}
	}
	if s == Auto || s == "" {
		return errs.New(errs.Usage, "CreateDirect needs a strategy, not auto")
	}
	if err := supported(s, t); err != nil {
		return err
	}
	if err := execCreate(ctx, conn, name, template, s, CreateOptions{Owner: owner}, t); err != nil {
		return sqlErr(ctx, err, "cannot create database %q from %q", name, template)
	}
	return nil
}
