package dbclone

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/internal/errs"
)

// TestSQLKind: each SQLSTATE pgfork meets maps to one kind.
func TestSQLKind(t *testing.T) {
	for _, c := range []struct {
		code, table, msg string
		want             errs.Kind
	}{
		{"42P04", "", "", errs.Exists},
		{"23505", "pg_database", "", errs.Exists},
		{"23505", "", `duplicate key value violates unique constraint "pg_database_datname_index"`, errs.Exists},
		{"23505", "items", "", errs.Internal},
		{"55006", "", "", errs.Busy},
		{"42501", "", "", errs.Permission},
		{"28P01", "", "", errs.Permission},
		{"28000", "", "", errs.Permission},
		{"3D000", "", "", errs.NotFound},
		{"53100", "", "", errs.NoSpace},
		{"58030", "", "could not write: No space left on device", errs.NoSpace},
		{"57014", "", "", errs.Interrupted},
		{"XX000", "", "", errs.Internal},
	} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: c.code, TableName: c.table, Message: c.msg})
		if got, ok := SQLKind(err); !ok || got != c.want {
			t.Errorf("%s %s %q: %v, want %v", c.code, c.table, c.msg, got, c.want)
		}
	}
	if _, ok := SQLKind(errors.New("not from the server")); ok {
		t.Errorf("a non-server error was classified")
	}
}

// TestCreateSameNameConcurrently: of several creations of one name at the
// same moment one wins and every other fails as Exists (the server reports
// 42P04 or, for inserts racing on pg_database, 23505), never Internal.
func TestCreateSameNameConcurrently(t *testing.T) {
	s := servers(t)[0]
	ctx := context.Background()
	admin := s.connect(t, "", "")
	const n = 6
	for round := range 4 {
		name := fmt.Sprintf("race %d", round)
		t.Cleanup(func() { dropDB(t, admin, name) })
		conns := make([]*pgx.Conn, n)
		for i := range conns {
			conns[i] = s.connect(t, "", "")
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errc := make(chan error, n)
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := Create(ctx, c, name, "template1", CreateOptions{Strategy: WalLog})
				errc <- err
			}()
		}
		close(start)
		wg.Wait()
		close(errc)
		won := 0
		for err := range errc {
			switch {
			case err == nil:
				won++
			case errs.KindOf(err) != errs.Exists:
				t.Errorf("round %d: %v (kind %v), want exists", round, err, errs.KindOf(err))
			}
		}
		if won != 1 {
			t.Errorf("round %d: %d creations succeeded, want 1", round, won)
		}
	}
}
