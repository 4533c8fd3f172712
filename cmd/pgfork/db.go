package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/dbclone"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
)

// dbFlags say which server the db commands talk to.
type dbFlags struct {
	url         string
	cluster     string
	canClone    bool
	calibration string
}

func (cl *cli) newDBCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "db",
		Short: "Copy, snapshot and restore databases inside a running server",
		Long: `Copy databases inside a running PostgreSQL server with CREATE DATABASE … TEMPLATE,
choosing the fastest strategy for the template and the server:

  wal_log    the default since PostgreSQL 15: every block goes through shared
             buffers and into WAL; cost grows with the template's size
  file_copy  copies the files but forces two checkpoints, whose cost grows with
             shared_buffers and dirty data
  clone      PostgreSQL 18+: file_copy with file_copy_method = clone, which shares
             blocks on a copy-on-write filesystem (XFS reflink, btrfs, ZFS 2.2+)

The server is a cluster pgfork started (--cluster NAME), a URL (--url, else
$DATABASE_URL), or the one the libpq environment variables (PGHOST, PGPORT,
PGUSER, PGDATABASE, PGPASSWORD…) point at. pgfork knows whether a managed
cluster's data directory can share blocks; for any other server say so with
--can-clone, or auto stays away from clone.`,
		Example: `  pgfork db create test_1 --from app_template --cluster dev
  pgfork db create --url postgres://localhost/postgres worker --from app --count 8 --jobs 2
  pgfork db advise --from app_template
  pgfork db snapshot app && pgfork db restore app`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&cl.dbf.url, "url", "", "server URL or libpq connection string (default: $DATABASE_URL, else the PG* environment variables), without a password: it is read from PGPASSFILE, ~/.pgpass or PGPASSWORD")
	secret.MarkConn(pf, "url")
	pf.StringVar(&cl.dbf.cluster, "cluster", "", "a cluster pgfork started (pgfork up)")
	pf.BoolVar(&cl.dbf.canClone, "can-clone", false, "the server's data directory is on a filesystem that shares blocks (reflink): allow the clone strategy")
	pf.StringVar(&cl.dbf.calibration, "calibration", "", "advisor constants saved by pgfork db calibrate --save (default: those stored for this server, else built-in)")
	cmd.AddCommand(cl.newDBCreateCmd(), cl.newDBAdviseCmd(), cl.newDBCalibrateCmd(),
		cl.newDBSnapshotCmd(), cl.newDBRestoreCmd(), cl.newDBSnapshotsCmd(), cl.newDBRmSnapshotCmd())
	return cmd
}

// dbServer is the server a db command talks to.
type dbServer struct {
	cl      *cli
	cfg     *pgx.ConnConfig
	conn    *pgx.Conn
	cluster string // managed cluster name, or ""
	target  *dbclone.Target
	cal     *dbclone.Calibration
	calFile string // where its calibration is (or would be) stored
	// learn is what the advisor learned from creations on this server,
	// stored in learnFile (beside the calibration) when it changed.
	learn     *dbclone.Learning
	learnFile string
	learnWas  []byte
}

func (s *dbServer) close() {
	_ = s.conn.Close(context.Background())
	s.saveLearning()
}

// learnedFile is where the learning beside calibration file cal is kept.
func learnedFile(cal string) string {
	if cal == "" {
		return ""
	}
	return strings.TrimSuffix(cal, ".json") + ".learned.json"
}

// loadLearning reads what earlier runs learned (a missing or unreadable
// file starts afresh: it is a cache of measurements, not configuration).
func (s *dbServer) loadLearning() {
	s.learn, s.learnFile = &dbclone.Learning{}, learnedFile(s.calFile)
	if s.learnFile == "" {
		return
	}
	if b, err := os.ReadFile(s.learnFile); err == nil {
		if json.Unmarshal(b, s.learn) != nil {
			s.learn = &dbclone.Learning{}
		}
	}
	s.learnWas, _ = json.Marshal(s.learn)
}

// saveLearning stores the learning when this run added to it (best
// effort: losing a measurement costs nothing but a slower convergence).
func (s *dbServer) saveLearning() {
	if s.learn == nil || s.learnFile == "" {
		return
	}
	if b, err := json.Marshal(s.learn); err == nil && !bytes.Equal(b, s.learnWas) {
		if err := writeJSONFile(s.learnFile, s.learn); err != nil {
			s.cl.infof("could not store what the advisor learned: %v", err)
		}
	}
}

// connectDB connects to the server chosen by the flags. When the connection
// would land in one of the databases in avoid (a template, or a database
// being replaced), it connects to postgres (or template1) instead.
func (cl *cli) connectDB(ctx context.Context, avoid ...string) (*dbServer, error) {
	s := &dbServer{cl: cl}
	connStr := cl.dbf.url
	if connStr == "" && cl.dbf.cluster == "" {
		connStr = cl.getenv("DATABASE_URL") // as `export DATABASE_URL=$(pgfork up)` leaves it
	}
	canClone := cl.dbf.canClone
	if cl.dbf.cluster != "" {
		if cl.dbf.url != "" {
			return nil, errs.New(errs.Usage, "give --cluster or --url, not both")
		}
		e, err := cluster.Get(cl.layout(), cl.dbf.cluster)
		if err != nil {
			return nil, err
		}
		if e.State != cluster.Running {
			return nil, errs.New(errs.Unsupported, "cluster %q is %s, not running", cl.dbf.cluster, e.State).
				WithHint("start a new one with `pgfork up`, see `pgfork ls`")
		}
		connStr, s.cluster = e.URL, cl.dbf.cluster
		if !canClone {
			if p, err := clone.Probe(ctx, filepath.Dir(e.DataDir), filepath.Dir(e.DataDir)); err == nil {
				canClone = p.SharesBlocks
			}
		}
	}
	cfg, err := pgx.ParseConfig(connStr)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad connection string").WithHint("use a URL like postgres://user@host:5432/postgres, or set PGHOST etc.")
	}
	for _, a := range avoid {
		if cfg.Database == a {
			cfg.Database = "postgres"
			for _, b := range avoid {
				if b == "postgres" {
					cfg.Database = "template1"
				}
			}
		}
	}
	dbclone.CancelOnServer(cfg)
	s.cfg = cfg
	if s.conn, err = pgx.ConnectConfig(ctx, cfg.Copy()); err != nil {
		if ctx.Err() != nil {
			return nil, errs.Wrap(errs.Interrupted, err, "interrupted")
		}
		if kind, ok := dbclone.SQLKind(err); ok && kind == errs.Permission {
			return nil, dbclone.SQLError(ctx, err, "the server refused the connection").
				WithHint("check the user in --url or PGUSER, its password (PGPASSWORD, PGPASSFILE, ~/.pgpass), and the server's pg_hba.conf")
		}
		return nil, errs.Wrap(errs.NotFound, err, "cannot connect to the server").
			WithHint("check --url, --cluster or the PG* environment variables, and that the server runs")
	}
	if s.target, err = dbclone.Inspect(ctx, s.conn, canClone); err != nil {
		s.close()
		return nil, err
	}
	if err := s.loadCalibration(); err != nil {
		s.close()
		return nil, err
	}
	s.loadLearning()
	return s, nil
}

// calibrationDir holds calibrations stored per managed cluster or per
// server system identifier.
func (cl *cli) calibrationDir() string { return filepath.Join(cl.layout().Root, "calibration") }

func (s *dbServer) defaultCalFile() string {
	switch {
	case s.cluster != "":
		return filepath.Join(s.cl.calibrationDir(), "cluster-"+s.cluster+".json")
	case s.target.SystemID != 0:
		return filepath.Join(s.cl.calibrationDir(), "system-"+strconv.FormatUint(s.target.SystemID, 10)+".json")
	}
	return ""
}

func (s *dbServer) loadCalibration() error {
	path, explicit := s.cl.dbf.calibration, s.cl.dbf.calibration != ""
	if !explicit {
		path = s.defaultCalFile()
	}
	s.calFile = path
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil
	}
	if err != nil {
		return errs.Wrap(errs.NotFound, err, "cannot read calibration").WithPath(path).WithHint("make one with `pgfork db calibrate --save %s`", path)
	}
	var c dbclone.Calibration
	if err := json.Unmarshal(b, &c); err != nil {
		return errs.Wrap(errs.Usage, err, "calibration file is not valid JSON").WithPath(path).WithHint("recreate it with `pgfork db calibrate`")
	}
	s.cal = &c
	return nil
}

func (cl *cli) newDBCreateCmd() *cobra.Command {
	var (
		from, strategy, owner string
		count, jobs           int
		force                 bool
		wait                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create NAME --from TEMPLATE",
		Short: "Create a database (or many) as a copy of a template database",
		Long: `Create database NAME as a copy of TEMPLATE with CREATE DATABASE … TEMPLATE, by the
strategy --strategy names (auto: the advisor's choice, see ` + "`pgfork db advise`" + `).

With --count N it creates NAME_1, NAME_2 … NAME_N (all N names must fit in 63
bytes), at most --jobs at a time, each on its own connection, with progress on
stderr and the rate at the end. If one fails, no more are started; those
created are kept and listed.

Nobody else may be connected to the template while it is copied: pgfork waits
up to --wait for other sessions to leave, then fails naming them (pid, user,
application, client), or terminates them with --force.

Each copy is made under a work-in-progress name (pgfork_wip_…) and renamed to
NAME when complete, so NAME never holds a half-made database: an interrupted
create (Ctrl-C, SIGTERM) removes its copy and exits 130, and the copy of a
killed one is removed by the next db command that creates or lists snapshots.`,
		Example: `  pgfork db create test_db --from app_template
  pgfork db create "My Test DB" --from app_template --strategy file_copy --owner app
  pgfork db create --from app_template worker --count 1000 --jobs 2
  pgfork db create ci --from app_template --force --wait 10s --cluster dev`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if from == "" {
				return errs.New(errs.Usage, "which template? --from TEMPLATE is required").WithHint("e.g. pgfork db create %s --from template1", name)
			}
			st, err := dbclone.ParseStrategy(strategy)
			if err != nil {
				return err
			}
			names := []string{name}
			if err := dbclone.CheckJobs(jobs); err != nil {
				return err
			}
			if cmd.Flags().Changed("count") {
				if names, err = dbclone.CountNames(name, count); err != nil {
					return err
				}
			} else if err := dbclone.ValidateName(name); err != nil {
				return err
			}
			if err := dbclone.ValidateName(from); err != nil {
				return err
			}
			ctx := cmd.Context()
			srv, err := cl.connectDB(ctx, from)
			if err != nil {
				return err
			}
			defer srv.close()
			opts := dbclone.CreateOptions{Strategy: st, Owner: owner, Force: force, WaitTimeout: wait, Target: srv.target, Calibration: srv.cal, Learning: srv.learn}
			if !cmd.Flags().Changed("count") {
				res, err := dbclone.Create(ctx, srv.conn, name, from, opts)
				if err != nil {
					return err
				}
				for _, s := range res.Terminated {
					cl.infof("terminated session %s on %q", s, from)
				}
				if res.Advice != nil {
					cl.infof("auto chose %s: %s", res.Strategy, res.Advice.Reasons[0])
				}
				if res.Plain {
					cl.infof("PostgreSQL %d has no STRATEGY option: ran a plain CREATE DATABASE (a file copy)", srv.target.Version)
				}
				if cl.g.json {
					return printJSON(cmd.OutOrStdout(), res)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "created database %q from %q by %s in %s\n", res.Name, from, res.Strategy, fmtDur(res.Elapsed))
				return nil
			}
			return cl.createMany(cmd, srv, names, from, opts, jobs)
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "template database to copy (required)")
	f.StringVar(&strategy, "strategy", "auto", "auto, wal_log, file_copy or clone")
	f.StringVar(&owner, "owner", "", "owner role of the new database(s) (default: the connected role)")
	f.IntVar(&count, "count", 1, "create N databases NAME_1 … NAME_N")
	f.IntVar(&jobs, "jobs", 2, "with --count: at most this many CREATE DATABASE at a time")
	f.BoolVar(&force, "force", false, "terminate other sessions on the template (after --wait)")
	f.DurationVar(&wait, "wait", 5*time.Second, "how long to wait for other sessions on the template to leave")
	return cmd
}

func (cl *cli) createMany(cmd *cobra.Command, srv *dbServer, names []string, from string, opts dbclone.CreateOptions, jobs int) error {
	ctx := cmd.Context()
	tty := isTerminal(cl.stderr) && !cl.g.quiet
	last := time.Now()
	progress := func(done, total int) {
		if cl.g.quiet {
			return
		}
		if tty && (time.Since(last) > 100*time.Millisecond || done == total) {
			last = time.Now()
			fmt.Fprintf(cl.stderr, "\rcreated %d/%d", done, total)
			if done == total {
				fmt.Fprintln(cl.stderr)
			}
		} else if !tty && (done == total || done%max(total/10, 1) == 0) {
			fmt.Fprintf(cl.stderr, "created %d/%d\n", done, total)
		}
	}
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		c, err := pgx.ConnectConfig(ctx, srv.cfg.Copy())
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot open another connection")
		}
		return c, nil
	}
	res, err := dbclone.CreateMany(ctx, connect, names, from, opts, jobs, progress)
	if res != nil {
		if res.Advice != nil {
			cl.infof("auto chose %s: %s", res.Strategy, res.Advice.Reasons[0])
		}
		cl.infof("%d databases in %s: %.1f dbs/s (%s, %d jobs)", len(res.Created), fmtDur(res.Elapsed), res.Rate, res.Strategy, jobs)
	}
	if err != nil {
		if res != nil && len(res.Created) > 0 {
			cl.infof("created before the failure (kept): %s", strings.Join(res.Created, ", "))
		}
		return err
	}
	if cl.g.json {
		return printJSON(cmd.OutOrStdout(), res)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "created %d databases %s … %s from %q by %s in %s (%.1f dbs/s)\n",
		len(res.Created), names[0], names[len(names)-1], from, res.Strategy, fmtDur(res.Elapsed), res.Rate)
	return nil
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
