package managed_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/server/managed"
)

func rolsuper(t *testing.T, adminURL, role string) bool {
	t.Helper()
	c, err := pgx.Connect(context.Background(), adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var su bool
	if err := c.QueryRow(context.Background(), "SELECT rolsuper FROM pg_roles WHERE rolname = $1", role).Scan(&su); err != nil {
		t.Fatal(err)
	}
	return su
}

// TestBootstrapSuperuserNeverAltered: asking for the managed cluster's own
// superuser as the test role (IntegreSQL's usual INTEGRESQL_TEST_PGUSER=
// postgres) is refused, never answered by demoting it; the cluster starts
// again afterwards.
func TestBootstrapSuperuserNeverAltered(t *testing.T) {
	dir := filepath.Join(testenv.Dir(t), "serve")
	u, err := instance.ResolveUser("")
	if err != nil {
		t.Fatal(err)
	}
	bin := testenv.PGBinDirs(t)[0]
	_, err = managed.Start(context.Background(), managed.Options{BinDir: bin, Dir: dir, User: u, Role: "postgres"})
	if errs.KindOf(err) != errs.Usage {
		t.Fatalf("managed.Start with role postgres: %v, want a usage error", err)
	}
	m := startManaged(t, dir)
	defer func() { _ = m.Stop(context.Background()) }()
	// The library guard holds on its own too.
	if err := managed.EnsureRole(context.Background(), m.AdminURL, "postgres", "secretsecretsecret", false); errs.KindOf(err) != errs.Usage {
		t.Fatalf("EnsureRole(postgres): %v, want a usage error", err)
	}
	if !rolsuper(t, m.AdminURL, "postgres") {
		t.Fatal("the bootstrap superuser was demoted")
	}
	// By default the role handed out is a superuser of the private cluster;
	// --least-privilege keeps an owner role.
	if !rolsuper(t, m.AdminURL, managed.DefaultRole) {
		t.Errorf("the managed role %s is not a superuser", managed.DefaultRole)
	}
	if err := m.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	lp, err := managed.Start(context.Background(), managed.Options{BinDir: bin, Dir: dir, User: u, LeastPrivilege: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lp.Stop(context.Background()) }()
	if rolsuper(t, lp.AdminURL, managed.DefaultRole) {
		t.Errorf("with LeastPrivilege the managed role %s is a superuser", managed.DefaultRole)
	}
}

func startManaged(t *testing.T, dir string) *managed.Server {
	t.Helper()
	m, err := managed.Start(context.Background(), managed.Options{BinDir: testenv.PGBinDirs(t)[0], Dir: dir, User: pgtest.User(t)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
