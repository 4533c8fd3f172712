package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/internal/statedir"
)

// globals are the flags every command accepts.
type globals struct {
	stateDir string
	pgBin    string // explicit PostgreSQL bin directory
	pgMajor  string // --pg MAJOR
	runAs    string // OS user to run initdb/postgres as when pgfork runs as root
	json     bool
	quiet    bool
}

// streams are what a command reads and writes besides its arguments and
// flags: main passes the process's own (osStreams), tests their own, so
// commands run in-process and in parallel.
type streams struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// lookupEnv reads the environment variables the CLI itself reads
	// (defaults of flags, serve's IntegreSQL variables).
	lookupEnv func(string) (string, bool)
}

// osStreams are the process's standard streams and environment.
func osStreams() streams {
	return streams{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, lookupEnv: os.LookupEnv}
}

// cli is one invocation of pgfork: its streams, its command tree and the
// flags the tree's commands share. newCLI builds a fresh one, so nothing of
// one invocation is left at package level for the next.
type cli struct {
	streams
	g          globals
	root       *cobra.Command
	dbf        dbFlags   // the db commands' server
	envErrs    []error   // environment variables set but invalid: refused (exit 2), not defaulted
	attachOnce sync.Once // the volume is re-attached at most once per invocation
}

// isTerminal reports whether f (a stream) is a terminal.
func isTerminal(f any) bool {
	fd, ok := f.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(fd.Fd()))
}

// getenv returns the environment variable name, or "".
func (cl *cli) getenv(name string) string {
	v, _ := cl.lookupEnv(name)
	return v
}

// newRootCmd returns a fresh pgfork command tree that reads and writes s.
func newRootCmd(s streams) *cobra.Command { return newCLI(s).root }

// newCLI returns an invocation of pgfork with a fresh command tree.
func newCLI(s streams) *cli {
	if s.lookupEnv == nil {
		s.lookupEnv = func(string) (string, bool) { return "", false }
	}
	if s.stdin == nil {
		s.stdin = strings.NewReader("")
	}
	cl := &cli{streams: s}
	root := &cobra.Command{
		Use:   "pgfork",
		Short: "Fast copies of PostgreSQL data: trees, clusters, databases, test pools",
		Long: `pgfork makes copies of PostgreSQL data fast, choosing the best method the
filesystem and the server allow (reflink clone, copy_file_range, CREATE DATABASE
strategies, the backup API, pg_upgrade transfer modes).

` + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		// The one place every command's secrets are read (from files and
		// the environment) and a secret on the command line is refused
		// (internal/secret, docs/SECURITY.md rule 2). No command has a
		// PersistentPreRunE of its own, which would replace this one
		// (TestNoSecretFlagOnCommandLine checks every flag).
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return secret.Load(cmd.Flags(), cl.lookupEnv)
		},
	}
	cl.root = root
	root.SetIn(s.stdin)
	root.SetOut(s.stdout)
	root.SetErr(s.stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&cl.g.stateDir, "state-dir", "", "pgfork's state directory (default $PGFORK_HOME, /var/lib/pgfork as root, else ~/.local/state/pgfork)")
	pf.StringVar(&cl.g.pgBin, "pg-bin", cl.getenv("PGFORK_PG_BIN"), "PostgreSQL bin directory to use (env PGFORK_PG_BIN)")
	pf.StringVar(&cl.g.pgMajor, "pg", cl.getenv("PGFORK_PG"), "PostgreSQL major version to use, e.g. 17 (env PGFORK_PG; default: newest found)")
	pf.StringVar(&cl.g.runAs, "run-as", cl.getenv("PGFORK_RUN_AS"), "OS user that runs initdb/postgres when pgfork runs as root (default postgres; env PGFORK_RUN_AS)")
	pf.BoolVar(&cl.g.json, "json", false, "print results as JSON")
	pf.BoolVarP(&cl.g.quiet, "quiet", "q", false, "print only results and errors")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return errs.Wrap(errs.Usage, err, "bad flag").WithHint("see `%s --help`", c.CommandPath())
	})
	// Flag descriptions wrap to helpWidth columns, so --help reads on an
	// 80-100 column terminal (cobra's default never wraps them).
	root.SetUsageTemplate(strings.ReplaceAll(root.UsageTemplate(), ".FlagUsages", fmt.Sprintf(".FlagUsagesWrapped %d", helpWidth)))
	root.AddCommand(cl.newBackupCmd(), cl.newBranchCmd(), cl.newCloneCmd(), cl.newCopyCmd(), cl.newDBCmd(), cl.newDoctorCmd(),
		cl.newDownCmd(), cl.newLsCmd(), cl.newPGCmd(), cl.newRestoreCmd(), cl.newServeCmd(), cl.newTemplateCmd(),
		cl.newUpCmd(), cl.newUpgradeCmd(), cl.newVolumeCmd())
	cl.addVersion(root)
	return cl
}

// helpWidth is the widest line --help prints.
const helpWidth = 95

// layout returns the state directory layout chosen by flags or defaults.
func (cl *cli) layout() statedir.Layout {
	d := statedir.Resolve(cl.baseStateDir())
	cl.attachVolumeOnce(cl.baseStateDir(), d)
	return statedir.Layout{Root: d}
}

// baseStateDir is the state directory chosen by flags or the environment,
// before a recorded volume moves it (statedir.Resolve): absolute, a
// relative one taken from the working directory once, here, for every
// path derived from it (a server's socket directory reaches postgres,
// whose working directory is its data directory).
func (cl *cli) baseStateDir() string {
	d := cl.g.stateDir
	if d == "" {
		d = statedir.BaseFrom(cl.getenv)
	}
	if abs, err := filepath.Abs(d); err == nil {
		d = abs
	}
	return d
}

// usageArgs wraps cobra's positional-argument validators so that their
// failures carry the Usage kind (exit code 2) and, when arguments are
// missing, name them from the command's Use line ("missing DST").
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			if missing := missingArgs(cmd.Use, len(args)); missing != "" {
				return errs.New(errs.Usage, "missing %s (usage: %s %s)", missing, cmd.Parent().CommandPath(), strings.TrimSuffix(cmd.Use, " [flags]")).
					WithHint("see `%s --help`", cmd.CommandPath())
			}
			return errs.Wrap(errs.Usage, err, "bad arguments").WithHint("see `%s --help`", cmd.CommandPath())
		}
		return nil
	}
}

// missingArgs names the required arguments of use ("restore BACKUP... DST",
// its first form when it lists several with " | ") that n given arguments
// leave out: the names after the n-th. "" when none is missing.
func missingArgs(use string, n int) string {
	first, _, _ := strings.Cut(use, " | ") // "restore BACKUP... DST | restore CHAINDIR DST"
	var req []string
	for _, f := range strings.Fields(first)[1:] {
		if strings.HasPrefix(f, "[") || strings.HasPrefix(f, "-") {
			continue
		}
		req = append(req, f)
	}
	if n >= len(req) {
		return ""
	}
	missing := req[n:] // a repeated argument ("BACKUP...") takes one or more: still req[n:]
	switch len(missing) {
	case 1:
		return missing[0]
	}
	return strings.Join(missing[:len(missing)-1], ", ") + " and " + missing[len(missing)-1]
}

// infof prints a progress or informational line to stderr unless --quiet.
func (cl *cli) infof(format string, args ...any) {
	if !cl.g.quiet {
		fmt.Fprintf(cl.stderr, format+"\n", args...)
	}
}

func (cl *cli) run(ctx context.Context, args []string) int {
	cl.root.SetArgs(args)
	err := cl.root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "accepts ") {
		err = errs.Wrap(errs.Usage, err, "bad command line").WithHint("see `pgfork --help`")
	}
	if ctx.Err() != nil && errs.KindOf(err) == errs.Internal {
		err = errs.Wrap(errs.Interrupted, err, "interrupted")
	}
	err = cl.volumeErrHint(err)
	cl.reportError(err)
	return exitCode(err)
}

func (cl *cli) reportError(err error) {
	if cl.g.json {
		_ = printJSON(cl.stderr, map[string]any{
			"error": err.Error(),
			"kind":  errs.KindOf(err).String(),
			"hint":  cliHint(err),
		})
		return
	}
	fmt.Fprintf(cl.stderr, "pgfork: error: %v\n", err)
	if h := cliHint(err); h != "" {
		fmt.Fprintf(cl.stderr, "hint: %s\n", h)
	}
}

// cliHint is the hint the CLI prints: the library's hint, which holds for
// every front end, then its command-line advice (errs.Error.CLI), which
// names pgfork's commands and flags and so is for the CLI only.
func cliHint(err error) string {
	h, c := errs.HintOf(err), errs.CLIHintOf(err)
	switch {
	case h == "":
		return c
	case c == "" || h == c:
		return h
	}
	return h + "; " + c
}
