package dbclone_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/pgtest"
)

// TestAwaitNoSessions: a rename right after a client's close finds the
// client's backend still exiting often enough that, without the wait, one
// of them sleeps PostgreSQL's 100 ms (CountOtherDBBackends); after
// AwaitNoSessions none should. It also reports a session left connected.
// A rename counts as waited only when a rename that cannot wait, right
// after it, was quick: the machine's load alone makes renames slow.
func TestAwaitNoSessions(t *testing.T) {
	inst := pgtest.New(t, pgtest.Server{})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, inst.ConnString("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, db := range []string{"aw_a", "aw_c"} {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
	}
	held, err := pgx.Connect(ctx, inst.ConnString("postgres", "aw_a"))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if dbclone.AwaitNoSessions(ctx, admin, "aw_a", 50*time.Millisecond) {
		t.Fatal("AwaitNoSessions saw no session while one is connected")
	}
	if d := time.Since(t0); d < 50*time.Millisecond {
		t.Fatalf("AwaitNoSessions gave up after %v, before its 50 ms", d)
	}
	_ = held.Close(ctx)
	from, to := "aw_a", "aw_b"
	// aw_c nobody connects to: its rename never waits, and says whether the
	// machine itself was slow at that moment (a loaded one makes a rename
	// take 90 ms without any wait).
	cfrom, cto := "aw_c", "aw_d"
	slow, loaded := 0, 0
	for range 30 {
		c, err := pgx.Connect(ctx, inst.ConnString("postgres", from))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close(ctx)
		if !dbclone.AwaitNoSessions(ctx, admin, from, time.Minute) {
			t.Fatalf("a closed session of %s still there after a minute", from)
		}
		t0 := time.Now()
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+from+" RENAME TO "+to); err != nil {
			t.Fatal(err)
		}
		took := time.Since(t0)
		t1 := time.Now()
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+cfrom+" RENAME TO "+cto); err != nil {
			t.Fatal(err)
		}
		switch control := time.Since(t1); {
		case control >= 45*time.Millisecond:
			loaded++ // no verdict from this one
		case took >= 90*time.Millisecond:
			slow++
		}
		from, to = to, from
		cfrom, cto = cto, cfrom
	}
	t.Logf("%d of 30 renames after AwaitNoSessions took PostgreSQL's 100 ms wait; %d not judged (a rename without any wait was slow too)", slow, loaded)
	// One may still meet the backend between leaving pg_stat_activity and
	// leaving the process array; more means the wait does not work.
	if slow > 4 {
		t.Fatalf("%d of 30 renames after AwaitNoSessions took PostgreSQL's 100 ms wait", slow)
	}
}
