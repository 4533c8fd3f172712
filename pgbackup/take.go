package pgbackup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/flock"
	"github.com/pgfork/pgfork/internal/proc"
	"github.com/pgfork/pgfork/pgbin"
)

// TakeOptions shape Take.
type TakeOptions struct {
	Dir         string        // chain directory; created if missing
	ConnString  string        // the server to back up (a libpq URL or key=value string)
	Incremental bool          // incremental to the newest backup in Dir
	PGBin       pgbin.Options // where to find pg_basebackup of the server's major
}

// Take runs pg_basebackup (plain format, manifest, fast checkpoint, WAL
// streamed) into a new directory under o.Dir named by time and kind
// ("20261123T031500Z-full", "...-incr"), taken into a hidden directory
// and renamed when complete. An incremental backup is based on the newest
// backup in o.Dir and needs summarize_wal = on (PostgreSQL 17+).
func Take(ctx context.Context, o TakeOptions) (*Backup, error) {
	if o.ConnString == "" {
		return nil, errs.New(errs.Usage, "no server to back up").WithHint("give the server's connection URL, postgres://USER@HOST:PORT/DB").WithCLI("--url postgres://USER@HOST:PORT/DB")
	}
	ccfg, err := pgx.ParseConfig(o.ConnString)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad connection URL").WithCLI("check --url").WithHint("give a libpq URL, e.g. postgres://postgres@localhost:5432/postgres")
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, ccfg)
	if err != nil {
		return nil, errs.Wrap(errs.NotFound, err, "cannot connect to the server to back up").
			WithHint("check the connection URL; pg_basebackup needs a role with REPLICATION and a pg_hba.conf line for replication").WithCLI("check --url")
	}
	var num int
	var summarize *string
	err = conn.QueryRow(cctx, "SELECT current_setting('server_version_num')::int, current_setting('summarize_wal', true)").Scan(&num, &summarize)
	conn.Close(cctx)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot read the server's version")
	}
	major := num / 10000
	var base *Backup
	if o.Incremental {
		if major < 17 {
			return nil, errs.New(errs.Unsupported, "incremental backups need PostgreSQL 17 or newer; the server is %d", major).
				WithHint("take full backups").WithCLI("drop --incremental")
		}
		if summarize == nil || *summarize != "on" {
			return nil, errs.New(errs.Unsupported, "the server does not summarize WAL (summarize_wal is off), which incremental backups need").
				WithHint("run ALTER SYSTEM SET summarize_wal = on; SELECT pg_reload_conf(); as a superuser, then take a full backup into %s and base incrementals on it", o.Dir).WithCLI("full backup: pgfork backup %s --url URL", o.Dir)
		}
		all, err := List(o.Dir)
		if err != nil && errs.KindOf(err) != errs.NotFound {
			return nil, err
		}
		if len(all) == 0 {
			return nil, errs.New(errs.NotFound, "no backup in %s to base an incremental backup on", o.Dir).
				WithHint("take a full backup into %s first", o.Dir).WithCLI("pgfork backup %s --url URL", o.Dir)
		}
		base = all[len(all)-1]
		if base.Major != major {
			return nil, errs.New(errs.Usage, "the newest backup (%s) is of PostgreSQL %d, the server is %d", base.Name(), base.Major, major).
				WithHint("take a full backup into a new directory")
		}
	}
	inst, err := pgbin.Find(o.PGBin, major)
	if err != nil {
		return nil, errs.Wrap(errs.KindOf(err), err, "pg_basebackup of PostgreSQL %d is needed", major).
			WithHint("install PostgreSQL %d", major).WithCLI("`pgfork pg install %d`, or point --pg-bin at it", major)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, errs.FromOS(err, o.Dir, "cannot create the backup directory")
	}
	// One backup at a time per chain directory (F6): a second caller exits
	// busy at once instead of racing for the same name. The lock is on the
	// directory itself and dies with the process.
	release, err := flock.LockDir(o.Dir)
	if err != nil {
		if errors.Is(err, flock.ErrBusy) {
			return nil, errs.New(errs.Busy, "another pgfork backup is running into %s", o.Dir).WithPath(o.Dir).
				WithHint("wait for it to finish, then run this backup again")
		}
		return nil, errs.FromOS(err, o.Dir, "cannot lock the backup directory")
	}
	defer release()
	CleanStalePartials(o.Dir)
	kind := "full"
	if base != nil {
		kind = "incr"
	}
	var name, final string
	for i := 0; ; i++ {
		name = time.Now().UTC().Format("20060102T150405Z") + "-" + kind
		final = filepath.Join(o.Dir, name)
		if _, err := os.Lstat(final); err != nil {
			break
		}
		if i == 3 {
			return nil, errs.New(errs.Exists, "a backup named %s already exists", name).WithPath(final).WithHint("wait a second and try again")
		}
		time.Sleep(time.Second) // names are by the second
	}
	// The partial directory is made here, by mkdir (which never follows a
	// planted name), with an unpredictable suffix and mode 0700 (F16), and
	// locked so that a later run can tell it from a crashed one's remains.
	partial, err := os.MkdirTemp(o.Dir, "."+name+partialMark)
	if err != nil {
		return nil, errs.FromOS(err, o.Dir, "cannot create the backup's partial directory")
	}
	unlockPartial, err := flock.LockDir(partial)
	if err != nil {
		_ = os.Remove(partial)
		return nil, errs.FromOS(err, partial, "cannot lock the backup's partial directory")
	}
	defer unlockPartial()
	args := []string{"-d", o.ConnString, "-D", partial, "-Fp", "-c", "fast", "-X", "stream", "--manifest-checksums=CRC32C"}
	if base != nil {
		args = append(args, "--incremental="+filepath.Join(base.Dir, "backup_manifest"))
	}
	cmd := exec.CommandContext(ctx, inst.Tool("pg_basebackup"), args...)
	cmd.Env = append(os.Environ(), inst.Env()...)
	// pg_basebackup dies with us (F5): a kill -9 of pgfork must not leave
	// it writing into a directory nobody will rename.
	proc.DieWithParent(cmd)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Start()
	if err == nil {
		if afterStart != nil {
			afterStart(partial)
		}
		err = cmd.Wait()
	}
	if err != nil {
		_ = os.RemoveAll(partial)
		msg := strings.TrimSpace(out.String())
		if ctx.Err() != nil {
			return nil, errs.Wrap(errs.Interrupted, ctx.Err(), "backup interrupted; nothing was kept")
		}
		if strings.Contains(msg, "No space left on device") || strings.Contains(msg, "Disk quota exceeded") {
			return nil, errs.New(errs.NoSpace, "the backup directory ran out of space: %s", msg).WithPath(o.Dir).
				WithHint("free space on the filesystem of %s (or back up elsewhere); nothing was kept", o.Dir)
		}
		return nil, errs.New(errs.Internal, "pg_basebackup failed: %s", msg).
			WithHint("the server's log says more; nothing was kept")
	}
	if err := os.Rename(partial, final); err != nil {
		_ = os.RemoveAll(partial)
		return nil, errs.Wrap(errs.Internal, err, "cannot move the finished backup into place").WithPath(final)
	}
	return OpenBackup(final)
}

// afterStart, when set (by tests), runs once pg_basebackup has started.
var afterStart func(partial string)

// partialMark is in the name of every backup directory still being written.
const partialMark = ".partial-"

// StalePartials names the partial directories in dir that no live process
// is writing: the remains of a killed or crashed backup.
func StalePartials(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() || !strings.HasPrefix(n, ".") || !(strings.Contains(n, partialMark) || strings.HasSuffix(n, ".partial")) {
			continue
		}
		if !flock.IsLockedByLiveProcess(filepath.Join(dir, n)) {
			out = append(out, n)
		}
	}
	return out
}

// CleanStalePartials removes StalePartials(dir) and returns the names it
// removed. Take calls it under the chain directory's lock.
func CleanStalePartials(dir string) []string {
	var gone []string
	for _, n := range StalePartials(dir) {
		if os.RemoveAll(filepath.Join(dir, n)) == nil {
			gone = append(gone, n)
		}
	}
	return gone
}

// Describe is one line about a backup for listings.
func Describe(b *Backup, all []*Backup) string {
	from := "-"
	if b.Label.Incremental() {
		from = "? (not here)"
		for _, o := range all {
			if o.Label.StartLSN == b.Label.PrevLSN && o.Label.StartTLI == b.Label.PrevTLI {
				from = o.Name()
			}
		}
	}
	return fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%s", b.Name(), b.Kind(), b.Major, b.Label.StartLSN, b.Label.StartTime, from)
}
