package dbclone

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
)

// Session is another session connected to a database.
type Session struct {
	PID         int    `json:"pid"`
	User        string `json:"user"`
	Application string `json:"application_name"`
	Client      string `json:"client"` // address, "local" for a Unix socket, "" when hidden
	BackendType string `json:"backend_type"`
}

func (s Session) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d", s.PID)
	var parts []string
	if s.User != "" {
		parts = append(parts, "user "+s.User)
	}
	if s.Application != "" {
		parts = append(parts, "application "+s.Application)
	}
	if s.Client != "" {
		parts = append(parts, "client "+s.Client)
	}
	if s.BackendType != "" && s.BackendType != "client backend" {
		parts = append(parts, s.BackendType)
	}
	if len(parts) > 0 {
		b.WriteString(" (" + strings.Join(parts, ", ") + ")")
	}
	return b.String()
}

// otherSessions selects, in pg_stat_activity, the sessions on database $1
// other than the asking one's; autovacuum workers are left out (CREATE
// DATABASE, RENAME and DROP stop them themselves).
const otherSessions = `datname = $1 AND pid <> pg_backend_pid() AND coalesce(backend_type, '') <> 'autovacuum worker'`

// Sessions lists the sessions other than conn's own connected to database
// db. Autovacuum workers are left out: CREATE DATABASE stops them itself.
func Sessions(ctx context.Context, conn *pgx.Conn, db string) ([]Session, error) {
	rows, err := conn.Query(ctx, `SELECT pid, coalesce(usename::text, ''), coalesce(application_name, ''),
			CASE WHEN client_addr IS NOT NULL THEN host(client_addr)
			     WHEN client_port = -1 THEN 'local' ELSE '' END,
			coalesce(backend_type, '')
		FROM pg_stat_activity WHERE `+otherSessions+`
		ORDER BY pid`, db)
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot list sessions on database %q", db)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) {
		var s Session
		err := r.Scan(&s.PID, &s.User, &s.Application, &s.Client, &s.BackendType)
		return s, err
	})
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot list sessions on database %q", db)
	}
	return out, nil
}

func busyErr(db string, sess []Session, cause error) *errs.Error {
	var list []string
	for _, s := range sess {
		list = append(list, s.String())
	}
	what := "other sessions"
	if len(list) > 0 {
		what = fmt.Sprintf("%d other session(s): %s", len(list), strings.Join(list, "; "))
	}
	e := errs.New(errs.Busy, "database %q is in use by %s", db, what)
	e.Err = cause
	return e.WithHint("close those sessions, wait longer, or ask for them to be terminated").WithCLI("--wait DURATION waits longer, --force terminates them")
}

// pollInterval is how often a wait for sessions to leave looks again.
const pollInterval = 50 * time.Millisecond

// Grace is how long a copy waits for sessions to leave even when told not
// to wait: a client that has just disconnected leaves its backend running
// for a few milliseconds more.
const Grace = 250 * time.Millisecond

// clearTemplate waits until no other session is connected to db or the
// deadline passes (without force, at least Grace); then, with force,
// terminates those left, else fails with errs.Busy naming them. It returns
// the sessions it terminated.
func clearTemplate(ctx context.Context, conn *pgx.Conn, db string, deadline time.Time, force bool) ([]Session, error) {
	if g := time.Now().Add(Grace); !force && deadline.Before(g) {
		deadline = g
	}
	for {
		sess, err := Sessions(ctx, conn, db)
		if err != nil {
			return nil, err
		}
		if len(sess) == 0 {
			return nil, nil
		}
		if time.Now().After(deadline) {
			if !force {
				return nil, busyErr(db, sess, nil)
			}
			return sess, Terminate(ctx, conn, sess)
		}
		select {
		case <-ctx.Done():
			return nil, errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted waiting for sessions on database %q", db)
		case <-time.After(min(pollInterval, time.Until(deadline)+time.Millisecond)):
		}
	}
}

// Terminate ends the given sessions with pg_terminate_backend and waits (up
// to 5 s each) for them to exit.
func Terminate(ctx context.Context, conn *pgx.Conn, sess []Session) error {
	for _, s := range sess {
		var ok bool
		err := conn.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, s.PID).Scan(&ok)
		if err != nil {
			if InsufficientPrivilege(err) {
				return sqlErr(ctx, err, "may not terminate session %s", s).
					WithHint("terminating another role's session needs superuser or pg_signal_backend")
			}
			return sqlErr(ctx, err, "cannot terminate session %s", s)
		}
	}
	return nil
}

// RowQuerier is what AwaitNoSessions asks with: a *pgx.Conn or a
// *pgxpool.Pool.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// awaitPoll is how often AwaitNoSessions looks again: one query on the
// server, a fraction of a millisecond.
const awaitPoll = time.Millisecond

// AwaitNoSessions waits, up to max, until no client session is connected
// to database db (autovacuum workers left out: the server stops them),
// looking every millisecond; it reports whether none is. A client that
// has just closed its connection leaves its backend exiting for a moment,
// and ALTER DATABASE … RENAME or DROP DATABASE that finds it there sleeps
// 100 ms before looking again (CountOtherDBBackends); measured on
// PostgreSQL 18, a rename right after the client's close took ~100 ms in
// 15–24 of 60 tries, none of 60 after this wait (median 0.4 ms either
// way). Errors count as sessions left: the caller's statement reports them.
func AwaitNoSessions(ctx context.Context, q RowQuerier, db string, max time.Duration) bool {
	deadline := time.Now().Add(max)
	for {
		var n int
		err := q.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE `+otherSessions, db).Scan(&n)
		if err == nil && n == 0 {
			return true
		}
		if err != nil || time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(awaitPoll):
		}
	}
}
