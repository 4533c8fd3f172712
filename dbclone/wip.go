package dbclone

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// Work in progress. Create never builds a database under its final name: it
// copies into pgfork_wip_<random> while holding a session-level advisory
// lock named after it, and renames the copy into place (with its comment and
// connection setting) in one transaction at the end. A copy interrupted by
// SIGTERM is dropped at once; one whose process was killed (kill -9) is left
// as a pgfork_wip_ database whose lock died with its session, and the next
// Create, Snapshots or RemoveSnapshot on that server drops it (Sweep). So no
// final name ever holds a half-made database, and an interrupted run never
// blocks retaking its name.
const wipPrefix = "pgfork_wip_"

// wipLockClass is the first key of pgfork's advisory locks on work in
// progress ("pgfk"); the second is a digest of the wip database's name.
const wipLockClass = 0x7067666b

func newWorkName() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return wipPrefix + hex.EncodeToString(b[:])
}

func wipLockKey(name string) int32 {
	h := sha256.Sum256([]byte(name))
	return int32(binary.BigEndian.Uint32(h[:4]))
}

// startWork picks a fresh work-in-progress name and takes the advisory lock
// that marks it alive.
func startWork(ctx context.Context, conn *pgx.Conn) (string, error) {
	for {
		name := newWorkName()
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", int32(wipLockClass), wipLockKey(name)).Scan(&ok); err != nil {
			return "", sqlErr(ctx, err, "cannot lock work in progress %q", name)
		}
		if ok {
			return name, nil
		}
		// Another run's lock has the same digest: pick another name.
	}
}

// unlockWork releases lockWork's lock (best effort: a broken connection
// released it already).
func unlockWork(ctx context.Context, conn *pgx.Conn, name string) {
	if conn.IsClosed() {
		return
	}
	_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, $2)", int32(wipLockClass), wipLockKey(name))
}

// dropWork drops work name after a failure, ignoring ctx's cancellation: a
// failed or interrupted Create must not leave it behind. When the connection
// is broken, the next Sweep drops it.
func dropWork(ctx context.Context, conn *pgx.Conn, name string) {
	if conn.IsClosed() {
		return
	}
	_, _ = conn.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+quote(name)+" WITH (FORCE)")
}

// Sweep drops the work-in-progress databases of runs that died (no session
// holds their lock) and returns their names. Databases it may not drop are
// skipped.
func Sweep(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT datname::text FROM pg_database WHERE datname LIKE 'pgfork\_wip\_%'`)
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot list work in progress")
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, sqlErr(ctx, err, "cannot list work in progress")
	}
	var dropped []string
	for _, n := range names {
		var free bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", int32(wipLockClass), wipLockKey(n)).Scan(&free); err != nil {
			return dropped, sqlErr(ctx, err, "cannot check work in progress %q", n)
		}
		if !free {
			continue // a live run is building it
		}
		_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+quote(n)+" WITH (FORCE)")
		unlockWork(ctx, conn, n)
		if err == nil {
			dropped = append(dropped, n)
		} else if ctx.Err() != nil {
			return dropped, sqlErr(ctx, err, "cannot drop abandoned work %q", n)
		}
	}
	return dropped, nil
}

// CancelOnServer makes a cancelled context cancel the running statement on
// the server (a cancel request) instead of just closing the connection,
// which leaves the server finishing a CREATE DATABASE nobody waits for. The
// connection stays usable, so Create can drop its work in progress before
// it returns. If the server does not answer within a few seconds the
// connection is closed after all (the next Sweep cleans up).
func CancelOnServer(cfg *pgx.ConnConfig) {
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
	}
}
