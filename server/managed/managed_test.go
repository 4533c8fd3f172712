package managed_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// TestVerifierForGeneratedPasswords: the role handed out with the
// password pgfork generated is stored as a SCRAM verifier of
// instance.GeneratedPasswordIterations (a client connecting spends no
// noticeable CPU: issue 33), connects over TCP with it and not with another
// password; a password the user chose keeps PostgreSQL's 4096 iterations.
func TestVerifierForGeneratedPasswords(t *testing.T) {
	ctx := context.Background()
	m := startManaged(t, filepath.Join(testenv.Dir(t), "serve"))
	defer func() { _ = m.Stop(ctx) }()
	verifier := func(role string) string {
		t.Helper()
		c, err := pgx.Connect(ctx, m.AdminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var v string
		if err := c.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v, want := verifier(managed.DefaultRole), fmt.Sprintf("SCRAM-SHA-256$%d:", instance.GeneratedPasswordIterations); !strings.HasPrefix(v, want) {
		t.Fatalf("verifier of the generated password %.20q…, want %q…", v, want)
	}
	tcp := func(pw string) error {
		u := url.URL{Scheme: "postgresql", User: url.UserPassword(m.Conn.Username, pw),
			Host: net.JoinHostPort(m.Conn.Host, strconv.Itoa(m.Conn.Port)), Path: "/postgres", RawQuery: "sslmode=disable"}
		c, err := pgx.Connect(ctx, u.String())
		if err == nil {
			c.Close(ctx)
		}
		return err
	}
	if err := tcp(m.Conn.Password); err != nil {
		t.Fatalf("TCP with the generated password: %v", err)
	}
	if err := tcp(instance.NewPassword()); err == nil {
		t.Fatal("TCP with another password was let in")
	}
	if err := managed.EnsureRole(ctx, m.AdminURL, "chosen", "my own pass phrase", false); err != nil {
		t.Fatal(err)
	}
	if v := verifier("chosen"); !strings.HasPrefix(v, "SCRAM-SHA-256$4096:") {
		t.Fatalf("verifier of a chosen password %.20q…, want 4096 iterations", v)
	}
	t.Run("SocketTrustsOnlyTheServersUser", func(t *testing.T) { socketTrustsOnlyTheServersUser(t, m) })
}

// socketTrustsOnlyTheServersUser (a subtest of
// TestVerifierForGeneratedPasswords, on its server): the managed server's Unix socket,
// where clients on this host connect without a password (serve hands its
// directory out on request: issue 33), is reached only by the server's OS
// user and root. Its directory is the user's and 0700; the handed-out role
// connects there without a password; the OS user nobody, asking for that
// role or for the bootstrap superuser, is refused by the kernel before
// PostgreSQL sees it (as root only: another user is needed).
func socketTrustsOnlyTheServersUser(t *testing.T, m *managed.Server) {
	ctx := context.Background()
	sock := m.Inst.SocketDir
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	uid := os.Geteuid() // the server's user: ours, or the run-as user as root
	if u := pgtest.User(t); u != nil {
		uid = u.UID
	}
	if fi.Mode().Perm() != 0o700 || int(st.Uid) != uid {
		t.Fatalf("socket directory %s: mode %v, owner %d; want 0700 and the server's user %d", sock, fi.Mode().Perm(), st.Uid, uid)
	}
	q := url.Values{"host": {sock}, "port": {strconv.Itoa(m.Inst.Port)}, "user": {m.Conn.Username}}
	c, err := pgx.Connect(ctx, "postgres:///postgres?"+q.Encode())
	if err != nil {
		t.Fatalf("the handed-out role on the socket without a password: %v", err)
	}
	c.Close(ctx)
	if os.Geteuid() != 0 {
		t.Log("not root: the OS user nobody cannot be tried")
		return
	}
	for _, role := range []string{m.Conn.Username, managed.BootstrapRole} {
		cmd := exec.Command(filepath.Join(testenv.PGBinDirs(t)[0], "psql"), "-X", "-w", "-At", "-h", sock, "-p", strconv.Itoa(m.Inst.Port),
			"-U", role, "-d", "postgres", "-c", "SELECT current_user")
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", "PGCONNECT_TIMEOUT=10"}
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Permission denied") {
			t.Errorf("the OS user nobody on the socket as %s: %v: %s (want Permission denied)", role, err, out)
		}
	}
}
