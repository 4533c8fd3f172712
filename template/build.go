package template

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
	"github.com/pgfork/pgfork/internal/statedir"
)

// build makes template key in a staging directory and renames it into
// place. The caller holds the key's exclusive lock.
func build(ctx context.Context, lay statedir.Layout, o Options, files []SetupFile, key string) (err error) {
	start := time.Now()
	// Anything staged for this key is a leftover: we hold its lock.
	old, _ := filepath.Glob(filepath.Join(lay.Templates(), stagingTag+key+"-*"))
	for _, d := range old {
		removeTree(d)
	}
	staging, err := os.MkdirTemp(lay.Templates(), stagingTag+key+"-")
	if err != nil {
		return errs.FromOS(err, lay.Templates(), "cannot create a staging directory for the template")
	}
	defer func() {
		if err != nil {
			removeTree(staging)
		}
	}()
	if err := os.Chmod(staging, 0o755); err != nil {
		return errs.FromOS(err, staging, "cannot prepare the staging directory")
	}
	data := filepath.Join(staging, dataSubdir)
	progress(o, "building template %s (PostgreSQL %s): initdb", key, o.PG.Version)
	io := o.initOptions(data)
	if err := instance.InitDB(ctx, io); err != nil {
		return err
	}
	if len(files) > 0 || o.SetupCmd != "" {
		if err := runSetup(ctx, lay, o, files, staging, data); err != nil {
			return err
		}
	}
	if err := checkShutDown(ctx, o, data); err != nil {
		return err
	}
	for _, f := range []string{"postmaster.opts", instance.LogFileName} {
		if err := os.Remove(filepath.Join(data, f)); err != nil && !os.IsNotExist(err) {
			return errs.FromOS(err, filepath.Join(data, f), "cannot clean the template")
		}
	}
	_ = os.Remove(filepath.Join(staging, "server.log"))
	if err := sparsifyWAL(data); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot make the template's WAL sparse").WithPath(data)
	}

	names := make([]string, 0, len(files))
	for _, f := range files {
		names = append(names, f.Name)
	}
	m := Meta{
		Format: FormatVersion, Key: key, PGVersion: o.PG.Version, PGMajor: o.PG.Major, BinDir: o.PG.BinDir,
		InitArgs: io.Args(), Setup: names, SetupCmd: o.SetupCmd, Created: time.Now().UTC(),
		BuildTime: time.Since(start), Size: DiskUsage(data),
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeSynced(filepath.Join(staging, metaFile), append(b, '\n')); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot write the template's metadata").WithPath(staging)
	}
	// initdb --no-sync and the test profile wrote without fsync: make the
	// whole template durable with one syncfs before it gets its name.
	if err := fsutil.SyncFS(staging); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot sync the template").WithPath(staging)
	}
	final := filepath.Join(lay.Templates(), key)
	if err := os.Rename(staging, final); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot move the finished template into place").WithPath(final)
	}
	_ = fsutil.SyncDir(lay.Templates())
	progress(o, "template %s ready in %s", key, time.Since(start).Round(time.Millisecond))
	return nil
}

// runSetup starts the staged cluster, applies the SQL files and the
// command, and shuts it down cleanly.
func runSetup(ctx context.Context, lay statedir.Layout, o Options, files []SetupFile, staging, data string) error {
	progress(o, "building template: applying setup")
	su := o.Init.Superuser
	if su == "" {
		su = "postgres"
	}
	tcp := o.SetupCmd != ""
	if tcp {
		// The setup command gets a TCP URL; 127.0.0.1 is open to every
		// local user, so TCP needs a password (trust stays on the
		// private socket). Clones keep this pg_hba.conf: without --tcp
		// they do not listen on TCP at all.
		if err := instance.WritePasswordHBA(data, o.User); err != nil {
			return err
		}
	}
	inst, err := instance.Start(ctx, instance.Config{
		BinDir: o.PG.BinDir, Env: o.PG.Env(), DataDir: data, User: o.User,
		// Under <state>/run, where the next run removes it if this
		// one is killed.
		SocketParent: lay.Run(),
		Profile:      instance.Test, TCP: tcp,
		LogFile: filepath.Join(staging, "server.log"), StartTimeout: time.Minute,
	})
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = inst.Stop(sctx, instance.Immediate)
			cancel()
		}
	}()
	if tcp {
		if err := inst.SetPassword(ctx, su, instance.NewPassword()); err != nil {
			return err
		}
	}
	sockURL := (&instance.Instance{SocketDir: inst.SocketDir, Port: inst.Port}).ConnString(su, "postgres")
	for _, f := range files {
		progress(o, "building template: %s", f.Name)
		if err := applySQL(ctx, o, f, sockURL); err != nil {
			return err
		}
	}
	if o.SetupCmd != "" {
		progress(o, "building template: running %s", o.SetupCmd)
		if err := runCmd(ctx, o.SetupCmd, inst, su); err != nil {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stopped = true
	if err := inst.Stop(sctx, instance.Fast); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot shut down the template cluster cleanly").WithPath(data)
	}
	return nil
}

// applySQL runs one SQL file with psql (ON_ERROR_STOP, no psqlrc), or, when
// the build has no psql, with pgx's simple protocol.
func applySQL(ctx context.Context, o Options, f SetupFile, url string) error {
	psql := filepath.Join(o.PG.BinDir, "psql")
	if _, err := os.Stat(psql); err != nil {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return errs.Wrap(errs.Internal, err, "cannot connect to the template cluster")
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, string(f.Data), pgx.QueryExecModeSimpleProtocol); err != nil {
			return errs.Wrap(errs.Usage, err, "setup file %s failed", f.Name).WithPath(f.Path).
				WithHint("fix the SQL and run again; no template was kept")
		}
		return nil
	}
	abs, _ := filepath.Abs(f.Path)
	// psql reads the file from disk; a file changed since it was hashed
	// would be caught by the next run's key.
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", abs)
	cmd.Env = append(append(os.Environ(), "LC_ALL=C", "PGAPPNAME=pgfork-template"), o.PG.Env()...)
	cmd.Dir = filepath.Dir(abs) // \i and \ir relative to the file
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return errs.Wrap(errs.Interrupted, ctx.Err(), "setup interrupted")
		}
		return errs.New(errs.Usage, "setup file %s failed:%s", f.Name, tail(out.String(), 20)).WithPath(f.Path).
			WithHint("fix the SQL and run again; no template was kept")
	}
	return nil
}

// runCmd runs the setup command with sh -c as the invoking user, with
// DATABASE_URL and the libpq PG* variables pointing at the template server.
func runCmd(ctx context.Context, command string, inst *instance.Instance, su string) error {
	url := inst.ConnString(su, "postgres")
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+url,
		"PGHOST="+inst.Host, "PGPORT="+strconv.Itoa(inst.Port),
		"PGUSER="+su, "PGDATABASE=postgres", "PGSSLMODE=disable",
	)
	if inst.Password != "" {
		cmd.Env = append(cmd.Env, "PGPASSWORD="+inst.Password)
	}
	if inst.Host == "" {
		cmd.Env = append(cmd.Env, "PGHOST="+inst.SocketDir)
	}
	// Its own process group, so a cancel also stops what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return errs.Wrap(errs.Interrupted, ctx.Err(), "setup command interrupted")
		}
		return errs.New(errs.Usage, "setup command %q failed (%v):%s", command, err, tail(out.String(), 20)).
			WithHint("fix the command and run again; no template was kept")
	}
	return nil
}

// checkShutDown verifies with pg_controldata that the cluster was shut down
// cleanly, so its clones start without recovery.
func checkShutDown(ctx context.Context, o Options, data string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(o.PG.BinDir, "pg_controldata"), data)
	cmd.Env = append(append(os.Environ(), "LC_ALL=C"), o.PG.Env()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return errs.Wrap(errs.Internal, err, "pg_controldata failed:%s", tail(string(out), 10)).WithPath(data)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Database cluster state" {
			if s := strings.TrimSpace(v); s != "shut down" {
				return errs.New(errs.Internal, "template cluster is not cleanly shut down (state %q)", s).WithPath(data)
			}
			return nil
		}
	}
	return errs.New(errs.Internal, "pg_controldata did not report the cluster state").WithPath(data)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return " (no output)"
	}
	return "\n    " + strings.Join(lines, "\n    ")
}

func writeSynced(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
