package pgclone

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// backupSession is one connection to the running source holding a
// non-exclusive base backup open: the backup lives exactly as long as the
// session, so a dropped connection aborts it (and pg_backup_stop then fails).
type backupSession struct {
	conn       session
	versionNum int
	segSize    int64
	slot       string // temporary physical slot holding WAL, "" if none
	warnings   []string
	start      pgdata.LSN
	started    bool
}

// backupResult is what pg_backup_stop returns.
type backupResult struct {
	LabelFile  string
	SpcMapFile string
	StopLSN    pgdata.LSN
}

// DefaultConnString returns a connection string for the server running on
// dataDir, from its postmaster.pid: its Unix socket directory and port (TCP
// on its listen address when it has no socket), as user postgres.
func DefaultConnString(dataDir string) (string, error) {
	return connStringAs(dataDir, "postgres")
}

func connStringAs(dataDir, user string) (string, error) {
	pf, err := instance.ReadPidFile(dataDir)
	if err != nil {
		return "", errs.Wrap(errs.NotFound, err, "cannot read postmaster.pid to find how to connect to the source").WithPath(dataDir).
			WithHint("is the source running? give a connection URL to say how to connect to it").WithCLI("--url")
	}
	q := url.Values{}
	u := url.URL{Scheme: "postgresql", User: url.User(user), Path: "/postgres"}
	host := pf.SocketDir
	if host == "" {
		host = pf.Listen
		switch host {
		case "", "*", "0.0.0.0":
			host = "127.0.0.1"
		case "::":
			host = "::1"
		}
		u.Host = net.JoinHostPort(host, strconv.Itoa(pf.Port))
	} else {
		q.Set("host", host)
		q.Set("port", strconv.Itoa(pf.Port))
	}
	q.Set("application_name", "pgfork clone")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// openBackupSession connects to the source and checks it is the server
// running on srcDir.
func openBackupSession(ctx context.Context, connString, srcDir string) (*backupSession, error) {
	conn, err := connectPgx(ctx, connString, srcDir)
	if err != nil {
		return nil, err
	}
	return newBackupSession(ctx, conn, srcDir)
}

// newBackupSession checks the session reaches the server running on srcDir
// and reads what the backup needs to know of it.
func newBackupSession(ctx context.Context, conn session, srcDir string) (*backupSession, error) {
	s := &backupSession{conn: conn}
	fail := func(e error) (*backupSession, error) { s.close(); return nil, e }

	var vnum string
	if err := s.queryRow(ctx, "SHOW server_version_num", nil, &vnum); err != nil {
		return fail(s.queryErr(ctx, err, "cannot read the server version"))
	}
	s.versionNum, _ = strconv.Atoi(vnum)
	if s.versionNum < 90600 {
		return fail(errs.New(errs.Unsupported, "the source server is version %s; online clones need PostgreSQL 9.6 or later", vnum).WithPath(srcDir).
			WithHint("stop the source cleanly and clone it offline").WithCLI("without --online"))
	}
	if err := s.checkSameServer(ctx, srcDir); err != nil {
		return fail(err)
	}
	var setting, unit string
	if err := s.queryRow(ctx, "SELECT setting, coalesce(unit, '') FROM pg_settings WHERE name = 'wal_segment_size'", nil, &setting, &unit); err != nil {
		return fail(s.queryErr(ctx, err, "cannot read wal_segment_size"))
	}
	n, _ := strconv.ParseInt(setting, 10, 64)
	switch unit {
	case "8kB":
		n *= 8192
	case "MB":
		n <<= 20
	}
	if n <= 0 || n&(n-1) != 0 {
		return fail(errs.New(errs.Internal, "the source reports an unusable wal_segment_size %q %q", setting, unit))
	}
	s.segSize = n
	return s, nil
}

// checkSameServer makes sure the connection reaches the server whose data
// directory is being copied: a backup of another server would be useless.
func (s *backupSession) checkSameServer(ctx context.Context, srcDir string) error {
	var dd string
	if err := s.queryRow(ctx, "SELECT current_setting('data_directory')", nil, &dd); err == nil {
		a, err1 := os.Stat(dd)
		b, err2 := os.Stat(srcDir)
		if err1 == nil && err2 == nil && os.SameFile(a, b) {
			return nil
		}
		return errs.New(errs.Usage, "the connection reaches the server of %s, not of the source", dd).WithPath(srcDir).
			WithHint("give a connection URL that reaches the server running on %s", srcDir).WithCLI("--url")
	}
	if ctx.Err() != nil {
		return errs.Wrap(errs.Interrupted, ctx.Err(), "clone interrupted")
	}
	// Without the privilege to read data_directory: compare the postmaster's
	// start time with postmaster.pid.
	pf, err := instance.ReadPidFile(srcDir)
	if err != nil {
		return errs.Wrap(errs.NotFound, err, "cannot read the source's postmaster.pid").WithPath(srcDir)
	}
	var epoch string
	if err := s.queryRow(ctx, "SELECT extract(epoch FROM pg_postmaster_start_time())::text", nil, &epoch); err != nil {
		return s.queryErr(ctx, err, "cannot check which server the connection reaches")
	}
	sec, _ := strconv.ParseFloat(epoch, 64)
	started := time.Unix(0, int64(sec*1e9))
	if d := started.Sub(pf.Started); d < -2*time.Second || d > 2*time.Second {
		return errs.New(errs.Usage, "the connection reaches a server started at %s, but the source's postmaster started at %s", started.Format(time.RFC3339), pf.Started.Format(time.RFC3339)).
			WithPath(srcDir).WithHint("give a connection URL that reaches the server running on %s", srcDir).WithCLI("--url")
	}
	return nil
}

// holdWAL creates a temporary physical replication slot on the session so
// the server keeps every WAL segment from now until the session ends, as
// pg_basebackup does. Without one (no free slot), a checkpoint during a long
// copy may recycle WAL the clone needs; planWAL then says so.
func (s *backupSession) holdWAL(ctx context.Context) {
	var pid string
	if err := s.queryRow(ctx, "SELECT pg_backend_pid()::text", nil, &pid); err != nil {
		s.warnings = append(s.warnings, fmt.Sprintf("no replication slot to hold WAL during the copy: %v", err))
		return
	}
	name := "pgfork_clone_" + pid
	var created string
	if err := s.queryRow(ctx, "SELECT slot_name::text FROM pg_create_physical_replication_slot($1, true, true)", []string{name}, &created); err != nil {
		s.warnings = append(s.warnings, fmt.Sprintf("no replication slot to hold WAL during the copy (%v); WAL recycled by a checkpoint during the copy would make the clone fail", pgMessage(err)))
		return
	}
	s.slot = name
}

// startBackup runs pg_backup_start (pg_start_backup before 15) with a fast
// checkpoint and returns the start LSN.
func (s *backupSession) startBackup(ctx context.Context, label string) (pgdata.LSN, error) {
	q := "SELECT pg_backup_start($1, fast => true)::text"
	if s.versionNum < 150000 {
		q = "SELECT pg_start_backup($1, true, false)::text"
	}
	var lsn string
	if err := s.queryRow(ctx, q, []string{label}, &lsn); err != nil {
		return 0, s.queryErr(ctx, err, "cannot start the online backup on the source")
	}
	s.started = true
	l, err := pgdata.ParseLSN(lsn)
	if err != nil {
		return 0, errs.Wrap(errs.Internal, err, "unexpected result of the backup start")
	}
	s.start = l
	return l, nil
}

// stopBackup runs pg_backup_stop (pg_stop_backup before 15) on the same
// session, without waiting for archiving (the clone gets its WAL directly).
func (s *backupSession) stopBackup(ctx context.Context) (*backupResult, error) {
	q := "SELECT labelfile, coalesce(spcmapfile, ''), lsn::text FROM pg_backup_stop(wait_for_archive => false)"
	if s.versionNum < 150000 {
		q = "SELECT labelfile, coalesce(spcmapfile, ''), lsn::text FROM pg_stop_backup(false, false)"
	}
	r := &backupResult{}
	var lsn string
	if err := s.queryRow(ctx, q, nil, &r.LabelFile, &r.SpcMapFile, &lsn); err != nil {
		if s.conn.closed() || isConnLost(err) {
			return nil, errs.Wrap(errs.Internal, err, "the connection to the source was lost during the copy, so the server aborted the backup").
				WithHint("clone again; keep the source reachable for the whole copy")
		}
		return nil, s.queryErr(ctx, err, "cannot stop the online backup on the source")
	}
	s.started = false
	l, err := pgdata.ParseLSN(lsn)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "unexpected result of the backup stop")
	}
	r.StopLSN = l
	return r, nil
}

// close ends the session; a backup still open is aborted by the server, and
// the temporary slot is dropped with the session.
func (s *backupSession) close() {
	if s == nil || s.conn == nil {
		return
	}
	s.conn.close()
}

// queryRow runs sql (with $1... bound to args) and stores the first row's
// columns, as text, in dest; a NULL becomes "".
func (s *backupSession) queryRow(ctx context.Context, sql string, args []string, dest ...*string) error {
	row, err := s.conn.queryRow(ctx, sql, args)
	if err != nil {
		return err
	}
	if len(row) != len(dest) {
		return fmt.Errorf("%s: %d columns, want %d", sql, len(row), len(dest))
	}
	for i, d := range dest {
		*d = row[i]
	}
	return nil
}

// configFiles asks the server where its configuration files are.
func (s *backupSession) configFiles(ctx context.Context) (*pgdata.ConfigFiles, error) {
	cf := &pgdata.ConfigFiles{FoundBy: "SHOW config_file"}
	if err := s.queryRow(ctx, "SELECT current_setting('config_file'), current_setting('hba_file'), current_setting('ident_file')", nil,
		&cf.ConfigFile, &cf.HBAFile, &cf.IdentFile); err != nil {
		return nil, s.queryErr(ctx, err, "cannot ask the source where its configuration is")
	}
	return cf, nil
}

func (s *backupSession) queryErr(ctx context.Context, err error, msg string) error {
	if ctx.Err() != nil {
		return errs.Wrap(errs.Interrupted, ctx.Err(), "clone interrupted")
	}
	switch {
	case dbclone.InsufficientPrivilege(err):
		return dbclone.SQLError(ctx, err, "%s", msg).
			WithHint("connect as a superuser, or GRANT EXECUTE on the backup functions and pg_read_all_settings to the connecting user").WithCLI("the user of --url")
	case dbclone.NotInPrerequisiteState(err): // wal_level minimal, backup already running
		return errs.Wrap(errs.Unsupported, err, "%s", msg).
			WithHint("online clones need wal_level = replica or logical on the source; otherwise stop it cleanly and clone it offline").WithCLI("without --online")
	}
	if isConnLost(err) {
		return errs.Wrap(errs.Internal, err, "%s: the connection to the source was lost", msg).WithHint("check the source's server log, then clone again")
	}
	return errs.Wrap(errs.Internal, err, "%s", msg)
}

func isConnLost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return dbclone.ConnectionLost(err)
	}
	return pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "unexpected EOF") ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}

func pgMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message
	}
	return err.Error()
}
