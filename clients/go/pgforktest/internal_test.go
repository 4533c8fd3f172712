package pgforktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgfork/pgfork/clients/go/client"
)

// TestExplicitUnreachableServerFails: a server named explicitly that does not
// answer is an error, not a skip.
func TestExplicitUnreachableServerFails(t *testing.T) {
	_, _, err := acquire(t.Context(), Options{ServerURL: "http://127.0.0.1:1", ExtraKey: "unreachable"})
	var unreachable *client.UnreachableError
	var skip *skipError
	if !errors.As(err, &unreachable) || errors.As(err, &skip) {
		t.Fatalf("err = %v, want an UnreachableError and no skip", err)
	}
}

// TestFailingMigrationDiscardsTemplate: when migrating fails the template is
// discarded, so that processes waiting for it fail at once, and later tests
// of this process get the same error without migrating again.
func TestFailingMigrationDiscardsTemplate(t *testing.T) {
	if os.Getenv("PGFORK_URL") == "" {
		t.Skip("PGFORK_URL unset; clients/test.sh sets it")
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	calls := 0
	opts := Options{
		ExtraKey: "failing/" + hex.EncodeToString(b),
		Migrate: func(ctx context.Context, connString string) error {
			calls++
			return RunSQLFiles(ctx, connString, "testdata/broken")
		},
	}
	_, _, err := acquire(t.Context(), opts)
	if err == nil || !strings.Contains(err.Error(), "migrating template") || !strings.Contains(err.Error(), "001_broken.sql") {
		t.Fatalf("err = %v, want a migration error naming the file", err)
	}
	_, _, err2 := acquire(t.Context(), opts)
	if err2 == nil || calls != 1 {
		t.Fatalf("second acquire: err = %v, migrations run %d times; want the cached error and 1 run", err2, calls)
	}

	hash, _ := Hash(opts)
	c, err := client.New(os.Getenv("PGFORK_URL"), client.WithToken(os.Getenv("PGFORK_TOKEN")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err = c.GetTestDatabase(ctx, hash)
	if !errors.Is(err, client.ErrTemplateDiscarded) && !errors.Is(err, client.ErrTemplateNotFound) {
		t.Fatalf("GetTestDatabase after failed migration: err = %v, want discarded or not found", err)
	}
}
