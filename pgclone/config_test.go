package pgclone_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgclone"
)

// server is a postgres process a test launched itself, with exactly the
// arguments it chose (instance.Start adds its own -D and -c options).
type server struct {
	pid  int
	done chan struct{}
}

// launch runs postgres with args as the test's OS user and waits until the
// server on dataDir is ready; it is stopped (immediate) when the test ends.
func (e pgEnv) launch(t *testing.T, dataDir, logFile string, args ...string) *server {
	t.Helper()
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := e.User.Command(context.Background(), e.Inst.Env(), filepath.Join(e.Bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(s.pid, syscall.SIGQUIT)
		<-s.done
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if pf, err := instance.ReadPidFile(dataDir); err == nil && pf.Pid == s.pid && pf.Status == "ready" {
			return s
		}
		select {
		case <-s.done:
			b, _ := os.ReadFile(logFile)
			t.Fatalf("postgres %s exited during start:\n%s", strings.Join(args, " "), b)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres %s did not become ready", strings.Join(args, " "))
		}
	}
}

// stop shuts the server down (fast) and waits for it to exit.
func (s *server) stop(t *testing.T) {
	t.Helper()
	_ = syscall.Kill(s.pid, syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(testenv.WaitTimeout):
		t.Fatal("postgres did not stop")
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startDebian starts the cluster as Debian's pg_ctlcluster does: -D names
// the configuration directory, config_file the postgresql.conf there.
func (e pgEnv) startDebian(t *testing.T, c pgtest.DebianCluster) *server {
	return e.launch(t, c.Data, filepath.Join(filepath.Dir(c.Data), "debian-main.log"),
		"-D", c.Conf, "-c", "config_file="+filepath.Join(c.Conf, "postgresql.conf"))
}

func sockURL(dir string, port int) string {
	return fmt.Sprintf("postgresql://postgres@/postgres?host=%s&port=%d", dir, port)
}

func TestDebianLayoutClone(t *testing.T) {
	forEachPG(t, func(t *testing.T, e pgEnv) {
		ctx := context.Background()
		base := testenv.Dir(t)
		c := e.NewDebianCluster(t, base)
		srv := e.startDebian(t, c)
		url := sockURL(c.Run, c.Port)
		if got := pgtest.Query(t, url, "SHOW data_directory"); got != c.Data {
			t.Fatalf("fixture: data_directory = %s, want %s", got, c.Data)
		}
		pgtest.Exec(t, url, "CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 1000) g")
		srv.stop(t)
		confBefore, dataBefore := testenv.TreeHash(t, c.Conf), testenv.TreeHash(t, c.Data)

		// checkClone starts the clone with -D alone and checks it runs on its
		// own files with the source's settings, while the source's pid file
		// (holding srcPid, 0 when stopped) is left alone.
		checkClone := func(t *testing.T, dst string, port, srcPid int) {
			t.Helper()
			for _, f := range []string{"postgresql.conf", "pg_hba.conf", "pg_ident.conf", "conf.d/custom.conf"} {
				if _, err := os.Stat(filepath.Join(dst, f)); err != nil {
					t.Errorf("the clone has no %s: %v", f, err)
				}
			}
			conf, _ := os.ReadFile(filepath.Join(dst, "postgresql.conf"))
			for _, name := range []string{"data_directory", "hba_file", "ident_file", "external_pid_file"} {
				if !strings.Contains(string(conf), "# pgfork clone: commented out, ") || !strings.Contains(string(conf), "\n#"+name+" = ") {
					t.Errorf("the clone's postgresql.conf does not comment out %s:\n%s", name, conf)
				}
			}
			cl := e.launch(t, dst, dst+".log", "-D", dst)
			curl := sockURL(c.Run, port)
			for _, q := range []struct{ sql, want string }{
				{"SHOW data_directory", dst},
				{"SHOW config_file", filepath.Join(dst, "postgresql.conf")},
				{"SHOW hba_file", filepath.Join(dst, "pg_hba.conf")},
				{"SHOW ident_file", filepath.Join(dst, "pg_ident.conf")},
				{"SHOW external_pid_file", ""},
				{"SHOW work_mem", "7MB"},
				{"SHOW archive_mode", "off"},
				{"SELECT sourcefile || ': ' || setting FROM pg_file_settings WHERE name = 'archive_command' AND applied", filepath.Join(dst, "postgresql.auto.conf") + ": "},
				{"SHOW restore_command", ""},
				{"SHOW primary_conninfo", ""},
				{"SHOW primary_slot_name", ""},
				{"SHOW port", strconv.Itoa(port)},
				{"SELECT count(*)::text FROM t", "1000"},
			} {
				if got := pgtest.Query(t, curl, q.sql); got != q.want {
					t.Errorf("clone: %s = %q, want %q", q.sql, got, q.want)
				}
			}
			hba, _ := os.ReadFile(filepath.Join(dst, "pg_hba.conf"))
			if !strings.Contains(string(hba), "# debian fixture hba") {
				t.Errorf("the clone's pg_hba.conf is not the source's:\n%s", hba)
			}
			pidf, err := os.ReadFile(c.PidFile)
			switch {
			case srcPid == 0 && err == nil:
				t.Errorf("the clone wrote the source's external pid file %s: %s", c.PidFile, pidf)
			case srcPid != 0 && strings.TrimSpace(string(pidf)) != strconv.Itoa(srcPid):
				t.Errorf("the source's external pid file says %q, want the source's pid %d (%v)", pidf, srcPid, err)
			}
			cl.stop(t)
		}

		t.Run("offline, configuration not found", func(t *testing.T) {
			dst := filepath.Join(base, "noconf")
			res, err := pgclone.Clone(ctx, pgclone.Options{Src: c.Data, Dst: dst, Installation: e.Inst, User: e.User})
			if err != nil {
				t.Fatal(err)
			}
			if !res.NoConfig || res.Config != nil {
				t.Errorf("NoConfig = %v, Config = %+v; want the result to say the clone has no configuration", res.NoConfig, res.Config)
			}
			if _, err := os.Stat(filepath.Join(dst, "postgresql.conf")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the clone has a postgresql.conf: %v", err)
			}
		})

		t.Run("offline, --config-dir", func(t *testing.T) {
			dst := filepath.Join(base, "offline")
			port := freeTCPPort(t)
			res, err := pgclone.Clone(ctx, pgclone.Options{Src: c.Data, Dst: dst, Installation: e.Inst, User: e.User, Port: port, ConfigDir: c.Conf})
			if err != nil {
				t.Fatal(err)
			}
			if res.NoConfig || res.Config == nil || res.Config.FoundBy != "--config-dir" {
				t.Fatalf("configuration not copied: NoConfig %v, Config %+v", res.NoConfig, res.Config)
			}
			t.Logf("copied %v, commented out %v", res.Config.Files, res.Config.CommentedOut)
			for _, f := range []string{"postgresql.conf", "conf.d/custom.conf", "pg_hba.conf", "pg_ident.conf"} {
				if !slices.Contains(res.Config.Files, f) {
					t.Errorf("Config.Files = %v, want %s in it", res.Config.Files, f)
				}
			}
			ownedBy(t, dst, e.User)
			testenv.SameTree(t, "source configuration after the clone", confBefore, testenv.TreeHash(t, c.Conf))
			testenv.SameTree(t, "source data after the clone", dataBefore, testenv.TreeHash(t, c.Data))
			checkClone(t, dst, port, 0)
			testenv.SameTree(t, "source configuration after the clone ran", confBefore, testenv.TreeHash(t, c.Conf))
			testenv.SameTree(t, "source data after the clone ran", dataBefore, testenv.TreeHash(t, c.Data))

			// Another cluster's configuration directory is refused.
			other := e.newCluster(t, base, "other")
			if err := os.Remove(filepath.Join(other, "postgresql.conf")); err != nil {
				t.Fatal(err)
			}
			_, err = pgclone.Clone(ctx, pgclone.Options{Src: other, Dst: filepath.Join(base, "other-dst"), Installation: e.Inst, User: e.User, ConfigDir: c.Conf})
			if errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), "is the configuration of the cluster at "+c.Data) {
				t.Errorf("--config-dir of another cluster: got %v, want a refusal", err)
			}
		})

		t.Run("online, found by SHOW", func(t *testing.T) {
			srv := e.startDebian(t, c)
			pgtest.Exec(t, url, "INSERT INTO t SELECT g FROM generate_series(1001, 1500) g")
			pgtest.Exec(t, url, "DELETE FROM t WHERE id > 1000")
			dst := filepath.Join(base, "online")
			port := freeTCPPort(t)
			res, err := pgclone.Clone(ctx, pgclone.Options{Src: c.Data, Dst: dst, Installation: e.Inst, User: e.User, Port: port, Online: true})
			if err != nil {
				t.Fatal(err)
			}
			if res.Config == nil || res.Config.FoundBy != "SHOW config_file" || res.Config.ConfigFile != filepath.Join(c.Conf, "postgresql.conf") {
				t.Fatalf("configuration not found by SHOW: %+v (warnings %v)", res.Config, res.Warnings)
			}
			testenv.SameTree(t, "source configuration after the online clone", confBefore, testenv.TreeHash(t, c.Conf))
			checkClone(t, dst, port, srv.pid)
			testenv.SameTree(t, "source configuration after the online clone ran", confBefore, testenv.TreeHash(t, c.Conf))
			if got := pgtest.Query(t, url, "SELECT count(*)::text FROM t"); got != "1000" {
				t.Errorf("source has %s rows, want 1000", got)
			}
			srv.stop(t)
		})
	})
}

// psqlAs runs one SQL statement with psql as the cluster's OS user over
// the socket (peer authentication) and returns its unaligned output.
func (e pgEnv) psqlAs(t *testing.T, in *instance.Instance, sql string) string {
	t.Helper()
	cmd := e.User.Command(context.Background(), e.Inst.Env(), filepath.Join(e.Bin, "psql"), "-X", "-At", "-v", "ON_ERROR_STOP=1",
		"-h", in.SocketDir, "-p", strconv.Itoa(in.Port), "-U", e.User.Name, "-d", "postgres", "-c", sql)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("psql -c %q: %v\n%s", sql, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

func TestOnlineCloneAsRootWithPeerAuth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: checks that pgfork as root reaches a source that only allows peer authentication")
	}
	forEachPG(t, func(t *testing.T, e pgEnv) {
		ctx := context.Background()
		base := testenv.Dir(t)
		src := e.newCluster(t, base, "src")
		if err := os.WriteFile(filepath.Join(src, "pg_hba.conf"), []byte("local all all peer\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		in := e.start(t, src, nil)
		// The fixture is right: root's own connection is refused.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if conn, err := pgx.Connect(cctx, in.ConnString("", "")); err == nil {
			conn.Close(cctx)
			t.Fatal("root connected as postgres: the source does not enforce peer authentication")
		}
		cancel()
		pgArgs := []string{"-h", in.SocketDir, "-p", strconv.Itoa(in.Port), "-U", e.User.Name}
		run := func(name string, args ...string) *exec.Cmd {
			return e.User.Command(ctx, e.Inst.Env(), filepath.Join(e.Bin, name), args...)
		}
		if out, err := run("pgbench", append(pgArgs, "-i", "-q", "-s", "2", "postgres")...).CombinedOutput(); err != nil {
			t.Fatalf("pgbench -i: %v\n%s", err, out)
		}
		// The load runs until stopped: a fixed duration ended before a
		// clone slowed by a busy machine did (seen in a run beside others).
		bg := startLoad(t, "pgbench on the source", run("pgbench", append(pgArgs, "-T", "600", "-c", "2", "-n", "postgres")...))
		time.Sleep(2 * time.Second)

		dst := filepath.Join(base, "dst")
		res, err := pgclone.Clone(ctx, pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User, Online: true, Port: 5441})
		if err != nil {
			t.Fatal(err)
		}
		if res.BackupUser != e.User.Name || res.WALFiles < 1 {
			t.Errorf("backup user %q (want %s), %d WAL files", res.BackupUser, e.User.Name, res.WALFiles)
		}
		t.Logf("online clone as root through psql as %s: WAL %s..%s, %s, warnings %v", res.BackupUser, res.StartLSN, res.StopLSN, res.Elapsed, res.Warnings)
		if strings.Contains(strings.Join(res.Warnings, " "), "no replication slot") {
			t.Errorf("the psql session held no replication slot: %v", res.Warnings)
		}
		bg.checkRunning(t, "before the clone did: not under load")

		cl := e.start(t, dst, nil)
		h := e.psqlAs(t, cl, "SELECT coalesce(sum(delta), 0) FROM pgbench_history")
		for _, tbl := range []string{"accounts:abalance", "tellers:tbalance", "branches:bbalance"} {
			name, col, _ := strings.Cut(tbl, ":")
			if got := e.psqlAs(t, cl, "SELECT coalesce(sum("+col+"), 0) FROM pgbench_"+name); got != h {
				t.Errorf("clone: sum(%s) = %s, sum(delta) = %s", col, got, h)
			}
		}
		if n := e.psqlAs(t, cl, "SELECT count(*) FROM pgbench_history"); n == "0" {
			t.Errorf("the clone has no pgbench history: not taken under load")
		}
		if n := e.psqlAs(t, cl, "SELECT count(*) FROM pgbench_accounts"); n != "200000" {
			t.Errorf("the clone has %s accounts, want 200000", n)
		}
		pgtest.Stop(t, cl)
		bg.stop(t)
	})
}

// TestOnlineCloneAsRootReportsServerErrors: through the psql session, a
// server error keeps its SQLSTATE (wal_level minimal: 55000, so a hint
// about wal_level), a failed slot creation does not end the session, and
// nothing is left at the destination.
func TestOnlineCloneAsRootReportsServerErrors(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the psql session is used as root without --url")
	}
	forEachPG(t, func(t *testing.T, e pgEnv) {
		base := testenv.Dir(t)
		src := e.newCluster(t, base, "src")
		e.start(t, src, map[string]string{"wal_level": "minimal", "max_wal_senders": "0"})
		dst := filepath.Join(base, "dst")
		_, err := pgclone.Clone(context.Background(), pgclone.Options{Src: src, Dst: dst, Installation: e.Inst, User: e.User, Online: true})
		if errs.KindOf(err) != errs.Unsupported || !strings.Contains(errs.HintOf(err), "wal_level") {
			t.Errorf("online clone of a wal_level=minimal source: got %v (hint %q), want Unsupported with a wal_level hint", err, errs.HintOf(err))
		}
		if _, err := os.Lstat(dst); err == nil {
			t.Errorf("the failed clone left %s", dst)
		}
		if l := leftovers(t, dst); len(l) > 0 {
			t.Errorf("leftovers beside the clone: %v", l)
		}
	})
}
