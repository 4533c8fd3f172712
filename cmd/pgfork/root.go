package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/internal/errs"
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

var (
	g       globals
	rootCmd = &cobra.Command{
		Use:   "pgfork",
		Short: "Fast copies of PostgreSQL data: trees, clusters, databases, test pools",
		Long: `pgfork makes copies of PostgreSQL data fast, choosing the best method the
filesystem and the server allow (reflink clone, copy_file_range, CREATE DATABASE
strategies, the backup API, pg_upgrade transfer modes).

` + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
)

func init() {
	pf := rootCmd.PersistentFlags()
	pf.StringVar(&g.stateDir, "state-dir", "", "pgfork's state directory (default $PGFORK_HOME, /var/lib/pgfork as root, else ~/.local/state/pgfork)")
	pf.StringVar(&g.pgBin, "pg-bin", os.Getenv("PGFORK_PG_BIN"), "PostgreSQL bin directory to use (env PGFORK_PG_BIN)")
	pf.StringVar(&g.pgMajor, "pg", os.Getenv("PGFORK_PG"), "PostgreSQL major version to use, e.g. 17 (env PGFORK_PG; default: newest found)")
	pf.StringVar(&g.runAs, "run-as", os.Getenv("PGFORK_RUN_AS"), "OS user that runs initdb/postgres when pgfork runs as root (default postgres; env PGFORK_RUN_AS)")
	pf.BoolVar(&g.json, "json", false, "print results as JSON")
	pf.BoolVarP(&g.quiet, "quiet", "q", false, "print only results and errors")
	rootCmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return errs.Wrap(errs.Usage, err, "bad flag").WithHint("see `%s --help`", c.CommandPath())
	})
	// Flag descriptions wrap to helpWidth columns, so --help reads on an
	// 80-100 column terminal (cobra's default never wraps them).
	rootCmd.SetUsageTemplate(strings.ReplaceAll(rootCmd.UsageTemplate(), ".FlagUsages", fmt.Sprintf(".FlagUsagesWrapped %d", helpWidth)))
}

// helpWidth is the widest line --help prints.
const helpWidth = 95

// layout returns the state directory layout chosen by flags or defaults.
func layout() statedir.Layout {
	d := statedir.Resolve(baseStateDir())
	attachVolumeOnce(baseStateDir(), d)
	return statedir.Layout{Root: d}
}

// baseStateDir is the state directory chosen by flags or the environment,
// before a recorded volume moves it (statedir.Resolve).
func baseStateDir() string {
	if g.stateDir != "" {
		return g.stateDir
	}
	return statedir.Base()
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
func infof(format string, args ...any) {
	if !g.quiet {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}

func run(ctx context.Context, args []string) int {
	rootCmd.SetArgs(args)
	err := rootCmd.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "accepts ") {
		err = errs.Wrap(errs.Usage, err, "bad command line").WithHint("see `pgfork --help`")
	}
	if ctx.Err() != nil && errs.KindOf(err) == errs.Internal {
		err = errs.Wrap(errs.Interrupted, err, "interrupted")
	}
	err = volumeErrHint(err)
	reportError(err)
	return exitCode(err)
}

func reportError(err error) {
	if g.json {
		_ = printJSON(os.Stderr, map[string]any{
			"error": err.Error(),
			"kind":  errs.KindOf(err).String(),
			"hint":  cliHint(err),
		})
		return
	}
	fmt.Fprintf(os.Stderr, "pgfork: error: %v\n", err)
	if h := cliHint(err); h != "" {
		fmt.Fprintf(os.Stderr, "hint: %s\n", h)
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
