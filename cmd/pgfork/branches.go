package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/cluster"
	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/internal/units"
)

// branchClient is `pgfork branch --server`'s link to a serve: one HTTP
// call per command (docs/branches.md).
type branchClient struct {
	server, token string
}

// call sends one request to serve's API (the branch routes; pgfork ls: the
// pools) and decodes the answer into
// out (nil: none); an error answer becomes the error kind of its status.
func (c *branchClient) call(ctx context.Context, method, path string, body, out any) error {
	if c.server == "" {
		return errs.New(errs.Usage, "no server given").WithCLI("pass --server http://HOST:PORT or set PGFORK_SERVER")
	}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.server, "/")+path, rd)
	if err != nil {
		return errs.Wrap(errs.Usage, err, "bad server URL %q", c.server)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot reach %s", c.server).WithHint("is pgfork serve running there?")
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode >= 300 {
		var e struct{ Message string }
		_ = json.Unmarshal(raw, &e)
		if e.Message == "" {
			e.Message = resp.Status
		}
		return errs.New(kindOfStatus(resp.StatusCode), "%s", e.Message)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return errs.Wrap(errs.Internal, err, "bad answer from %s", c.server)
		}
	}
	return nil
}

// kindOfStatus is server.StatusOf read backwards.
func kindOfStatus(code int) errs.Kind {
	switch code {
	case http.StatusBadRequest:
		return errs.Usage
	case http.StatusNotFound:
		return errs.NotFound
	case http.StatusLocked, http.StatusConflict:
		return errs.Exists
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return errs.Busy
	case http.StatusInsufficientStorage:
		return errs.NoSpace
	case http.StatusUnauthorized, http.StatusForbidden:
		return errs.Permission
	}
	return errs.Internal
}

// branchService is what `pgfork branch` asks: the branches of the state
// directory in this process (branches.Local) or a serve's, over HTTP
// (branchClient); the same verbs either way (docs/branches.md).
type branchService interface {
	Create(ctx context.Context, o branches.CreateOptions) (branches.Branch, error)
	List(ctx context.Context) (branches.ListResult, error)
	Reset(ctx context.Context, name string) (branches.Branch, error)
	Start(ctx context.Context, name string) (branches.Branch, error)
	Stop(ctx context.Context, name string) (branches.Branch, error)
	Protect(ctx context.Context, name string, on bool) (branches.Branch, error)
	Delete(ctx context.Context, name string) error
	Snapshot(ctx context.Context, o branches.SnapshotOptions) (branches.Snapshot, error)
	DeleteSnapshot(ctx context.Context, name string) error
	Close()
}

var (
	_ branchService = (*branches.Local)(nil)
	_ branchService = (*branchClient)(nil)
)

// Create asks for a branch (POST /api/v2/branches).
func (c *branchClient) Create(ctx context.Context, o branches.CreateOptions) (b branches.Branch, err error) {
	if o.Port != 0 {
		return b, errs.New(errs.Usage, "a server chooses its branches' ports").WithCLI("drop --port")
	}
	if o.DataDir != "" {
		return b, errs.New(errs.Usage, "a server keeps its branches where it chooses").WithCLI("drop --data-dir")
	}
	err = c.call(ctx, "POST", "/api/v2/branches", map[string]any{"name": o.Name, "source": o.Source,
		"snapshot": o.Snapshot, "from": o.From, "ttl_seconds": int64(o.TTL.Seconds()), "protected": o.Protected}, &b)
	return b, err
}

// List lists sources, snapshots and branches (GET /api/v2/branches).
func (c *branchClient) List(ctx context.Context) (l branches.ListResult, err error) {
	err = c.call(ctx, "GET", "/api/v2/branches", nil, &l)
	return l, err
}

// verb is one POST or DELETE on a branch answered by the branch.
func (c *branchClient) verb(ctx context.Context, method, name, verb string) (b branches.Branch, err error) {
	err = c.call(ctx, method, "/api/v2/branches/"+url.PathEscape(name)+"/"+verb, nil, &b)
	return b, err
}

// Reset puts a branch back to its snapshot.
func (c *branchClient) Reset(ctx context.Context, name string) (branches.Branch, error) {
	return c.verb(ctx, "POST", name, "reset")
}

// Start starts a stopped branch.
func (c *branchClient) Start(ctx context.Context, name string) (branches.Branch, error) {
	return c.verb(ctx, "POST", name, "start")
}

// Stop stops a branch's server.
func (c *branchClient) Stop(ctx context.Context, name string) (branches.Branch, error) {
	return c.verb(ctx, "POST", name, "stop")
}

// Protect protects a branch (POST) or no longer (DELETE).
func (c *branchClient) Protect(ctx context.Context, name string, on bool) (branches.Branch, error) {
	if on {
		return c.verb(ctx, "POST", name, "protect")
	}
	return c.verb(ctx, "DELETE", name, "protect")
}

// Delete deletes a branch.
func (c *branchClient) Delete(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/api/v2/branches/"+url.PathEscape(name), nil, nil)
}

// Snapshot takes a named snapshot of a branch (or of a source).
func (c *branchClient) Snapshot(ctx context.Context, o branches.SnapshotOptions) (s branches.Snapshot, err error) {
	if o.Branch != "" {
		err = c.call(ctx, "POST", "/api/v2/branches/"+url.PathEscape(o.Branch)+"/snapshot", map[string]any{"name": o.Name, "keep": o.Keep}, &s)
	} else {
		err = c.call(ctx, "POST", "/api/v2/snapshots", map[string]any{"name": o.Name, "source": o.Source, "keep": o.Keep}, &s)
	}
	return s, err
}

// DeleteSnapshot deletes a named snapshot.
func (c *branchClient) DeleteSnapshot(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/api/v2/snapshots/"+url.PathEscape(name), nil, nil)
}

// Close does nothing: each call is its own request.
func (c *branchClient) Close() {}

// open is the service a command asks: the serve named by --server, or
// else the state directory's branches in this process, with the sources
// a create names.
func (c *branchClient) open(ctx context.Context, cl *cli, sources ...branches.Source) (branchService, error) {
	if c.server != "" {
		return c, nil
	}
	user, err := instance.ResolveUser(cl.g.runAs)
	if err != nil {
		return nil, err
	}
	return branches.OpenLocal(ctx, branches.LocalOptions{Layout: cl.layout(), Sources: sources, PGBin: cl.g.pgBin, User: user,
		OnNotice: cl.printNotice})
}

// printNotice prints on stderr, in one line, that a branch's source is
// copied onto the state directory's filesystem (restore --start: DST's)
// instead of cloned, how much, and how to clone it (every local create from a source: pgfork
// branch create, restore --start, clone --start). A warning: --quiet
// keeps it.
func (cl *cli) printNotice(n branches.Notice) {
	if n.DataDir != "" {
		fmt.Fprintf(cl.stderr, "warning: source %s is copied, not cloned: about %s from %s (%s) into %s (%s), another filesystem; "+
			"to clone it, give a data directory on the filesystem of %s\n",
			n.Source, units.Bytes(n.Bytes), n.From, n.SrcFS, n.DataDir, n.DstFS, n.From)
		return
	}
	store := ""
	if n.NoStore != "" {
		// pgfork branch create tried the branch store beside the source.
		store = "; not in a branch store beside the source, because " + n.NoStore
	}
	fmt.Fprintf(cl.stderr, "warning: source %s is copied, not cloned: about %s from %s (%s) into the state directory %s (%s), another filesystem%s; "+
		"to clone it, give --data-dir DIR (this branch) or --state-dir DIR (every branch; or set PGFORK_HOME) with DIR on the filesystem of %s\n",
		n.Source, units.Bytes(n.Bytes), n.From, n.SrcFS, n.To, n.DstFS, store, n.From)
}

// refuseWithStart refuses the flags of cmd named that were given: they
// shape a copy into a directory, which --start (a branch) does not make.
func refuseWithStart(cmd *cobra.Command, names []string) error {
	for _, f := range names {
		if cmd.Flags().Changed(f) {
			return errs.New(errs.Usage, "--%s is not for --start: --start makes a branch", f).
				WithCLI("drop --%s, or drop --start to copy into DST", f)
		}
	}
	return nil
}

// branchAlias is how restore --start and clone --start (the command how)
// end: the pgfork branch create they are the older spelling of, said so,
// made on this machine's branches from src and printed. The branch is
// named name, else after DST; port is --port (empty or "auto": a free one).
// DST is the branch's data directory, its snapshot beside it
// (docs/branches.md, "Where the data goes").
func (cl *cli) branchAlias(cmd *cobra.Command, how string, src branches.Source, dst, name, port string) error {
	p, err := cluster.ParsePort(port)
	if err != nil {
		return err
	}
	if name == "" {
		name = filepath.Base(filepath.Clean(dst))
	}
	src.Name = branches.DefaultSourceName(src)
	// DST is the branch's data directory, its snapshot beside it: on the
	// source's filesystem both are clones, wherever the state directory
	// is (issue 60).
	cl.infof("note: %s makes a branch, the same as `pgfork branch create %s --source %s --data-dir %s`",
		how, name, src, dst)
	user, err := instance.ResolveUser(cl.g.runAs)
	if err != nil {
		return err
	}
	l, err := branches.OpenLocal(cmd.Context(), branches.LocalOptions{Layout: cl.layout(), Sources: []branches.Source{src}, PGBin: cl.g.pgBin, User: user,
		OnNotice: cl.printNotice})
	if err != nil {
		return err
	}
	defer l.Close()
	cl.infof("making branch %s (recovery may take a moment)...", name)
	b, err := l.Create(cmd.Context(), branches.CreateOptions{Name: name, Source: src.Name, Port: p, DataDir: dst})
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if cl.g.json {
		return printJSON(w, b)
	}
	fmt.Fprintf(w, "branch %s started: %s\n", b.Name, b.Conn)
	fmt.Fprintf(w, "  reset     pgfork branch reset %s\n", b.Name)
	fmt.Fprintf(w, "  snapshot  pgfork branch snapshot %s SNAPSHOT\n", b.Name)
	fmt.Fprintf(w, "  remove    pgfork branch rm %s\n", b.Name)
	return nil
}

// localSource reads a create's --source without a server: KIND:PATH.
func localSource(spec string) (branches.Source, error) {
	src, err := branches.ParseSource(spec)
	if err != nil && !strings.Contains(spec, ":") {
		return src, errs.New(errs.Usage, "no source %q on this machine", spec).
			WithCLI("without --server a source is written KIND:PATH (cluster:DATADIR, backup:CHAINDIR); a bare name is a source declared to a pgfork serve: add --server")
	}
	return src, err
}

func (cl *cli) newBranchCmd() *cobra.Command {
	c := &branchClient{}
	cmd := &cobra.Command{
		Use:   "branch",
		Short: "Branches: copies you can reset, snapshot and throw away",
		Long: `A branch is a started copy of a source (a running cluster, a backup chain),
a snapshot or another branch, with its own port, role and password: reset it
to where it began, snapshot it, protect it, stop and start it, remove it.

Without --server the branches are this machine's, kept in the state
directory (no server needed; a source is written cluster:DATADIR or
backup:CHAINDIR[@BACKUP]). With --server (or PGFORK_SERVER) the same commands
ask a pgfork serve started with --branch-source, over its /api/v2 API; a
source is then one the server declares, by name, and the token you pass owns
the branches you create. See docs/branches.md.`,
		Example: `  # on this machine
  pgfork branch create mine --source cluster:/var/lib/postgresql/18/main
  pgfork branch reset mine
  # on a team server
  PGFORK_TOKEN=$T pgfork branch create mine --source prod --server http://db1:5433`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.server, "server", cl.getenv("PGFORK_SERVER"), "the pgfork serve to ask, http://HOST:PORT (env PGFORK_SERVER; none: this machine's branches)")
	secret.MarkConn(pf, "server")
	secret.Var(pf, &c.token, "token", "PGFORK_TOKEN", "TOKEN", "your token for --server")
	// run opens the service, runs one call on it, and prints the branch it
	// answers (its URL; --json: all of it).
	run := func(ctx context.Context, sources []branches.Source, call func(branchService) (any, error)) error {
		svc, err := c.open(ctx, cl, sources...)
		if err != nil {
			return err
		}
		defer svc.Close()
		v, err := call(svc)
		if err != nil || v == nil {
			return err
		}
		if cl.g.json {
			return printJSON(cl.stdout, v)
		}
		switch v := v.(type) {
		case branches.Branch:
			fmt.Fprintln(cl.stdout, v.Conn)
		case branches.Snapshot:
			fmt.Fprintln(cl.stdout, v.Name)
		case branches.ListResult:
			return printBranchList(cl.stdout, v)
		}
		return nil
	}

	var co branches.CreateOptions
	create := &cobra.Command{
		Use: "create NAME (--source S | --snapshot S | --from BRANCH)", Short: "Create a branch and print its connection string",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			co.Name = args[0]
			var sources []branches.Source
			if c.server == "" && co.Source != "" {
				src, err := localSource(co.Source)
				if err != nil {
					return err
				}
				sources, co.Source = []branches.Source{src}, src.Name
			}
			return run(cmd.Context(), sources, func(s branchService) (any, error) {
				b, err := s.Create(cmd.Context(), co)
				if err == nil && b.Store != "" {
					cl.infof("branch %s: its data directory is %s, in the branch store beside the source: a clone on its filesystem (the state directory is on another one)",
						b.Name, b.DataDir)
				}
				return b, err
			})
		},
	}
	create.Flags().StringVar(&co.Source, "source", "", "a source: KIND:PATH here (cluster:DATADIR, backup:CHAINDIR[@BACKUP] or backup:FULL+INCR...); with --server, a name the server declares")
	secret.MarkConn(create.Flags(), "source")
	create.Flags().StringVar(&co.Snapshot, "snapshot", "", "a snapshot")
	create.Flags().StringVar(&co.From, "from", "", "another branch of yours")
	create.Flags().DurationVar(&co.TTL, "ttl", 0, "delete it after this long (0: never)")
	create.Flags().BoolVar(&co.Protected, "protect", false, "refuse to delete it until unprotected")
	create.Flags().IntVar(&co.Port, "port", 0, "without --server: its TCP port (default: a free one)")
	create.Flags().StringVar(&co.DataDir, "data-dir", "", "without --server, with --source: the branch's data directory, a new one; its snapshot is kept beside it, on its filesystem (on the source's, both are clones); without it, a branch that could not be cloned into the state directory goes to a branch store beside the source (docs/branches.md)")

	ls := &cobra.Command{
		Use: "ls", Short: "List sources, snapshots and your branches", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd.Context(), nil, func(s branchService) (any, error) { return s.List(cmd.Context()) })
		},
	}
	oneName := func(verb, short string, call func(branchService, context.Context, string) (branches.Branch, error)) *cobra.Command {
		return &cobra.Command{
			Use: verb + " NAME", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return run(cmd.Context(), nil, func(s branchService) (any, error) { return call(s, cmd.Context(), args[0]) })
			},
		}
	}
	reset := oneName("reset", "Put a branch back to the point it was made from (same port and password)", branchService.Reset)
	start := oneName("start", "Start a stopped branch (same port and password)", branchService.Start)
	stop := oneName("stop", "Stop a branch's server, keeping its data (it stays stopped until started)", branchService.Stop)
	var off bool
	protectCmd := oneName("protect", "Protect a branch from deletion (--off to allow it again)",
		func(s branchService, ctx context.Context, name string) (branches.Branch, error) {
			return s.Protect(ctx, name, !off)
		})
	protectCmd.Flags().BoolVar(&off, "off", false, "remove the protection")
	var keep int
	snapshot := &cobra.Command{
		Use: "snapshot BRANCH NAME", Short: "Take a named read-only snapshot of a branch", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd.Context(), nil, func(s branchService) (any, error) {
				return s.Snapshot(cmd.Context(), branches.SnapshotOptions{Branch: args[0], Name: args[1], Keep: keep})
			})
		},
	}
	snapshot.Flags().IntVar(&keep, "keep", 0, "keep only your newest N snapshots of this branch (0: all; other tokens' are never removed)")
	var isSnap bool
	rm := &cobra.Command{
		Use: "rm NAME...", Short: "Delete branches (or snapshots, with --snapshot)", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd.Context(), nil, func(s branchService) (any, error) {
				for _, n := range args {
					del := s.Delete
					if isSnap {
						del = s.DeleteSnapshot
					}
					if err := del(cmd.Context(), n); err != nil {
						return nil, err
					}
				}
				return nil, nil
			})
		},
	}
	rm.Flags().BoolVar(&isSnap, "snapshot", false, "the names are snapshots")
	cmd.AddCommand(create, ls, reset, start, stop, snapshot, protectCmd, rm)
	return cmd
}

// printBranchList prints `pgfork branch ls`: one line per source, snapshot
// and branch, then each owner's use against the quotas.
func printBranchList(out io.Writer, l branches.ListResult) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tNAME\tFROM\tOWN\tSHARED\tAGE\tURL")
	for _, s := range l.Sources {
		fmt.Fprintf(w, "source\t%s\t%s\t\t\t\t%s\n", s.Name, s.Kind, lagText(s.Lag))
	}
	for _, s := range l.Snapshots {
		fmt.Fprintf(w, "snapshot\t%s\t%s\t%s\t%s\t%s\t\n", s.Name, s.From, units.Bytes(s.Size-s.Shared), units.Bytes(s.Shared),
			time.Since(s.Created).Round(time.Second))
	}
	for _, b := range l.Branches {
		name := b.Name
		if b.Protected {
			name += " (protected)"
		}
		if b.State != "ready" {
			name += " (" + b.State + ")"
		}
		fmt.Fprintf(w, "branch\t%s\t%s\t%s\t%s\t%s\t%s\n", name, b.From, units.Bytes(b.Size-b.Shared), units.Bytes(b.Shared),
			time.Since(b.Created).Round(time.Second), b.Conn)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	// Each owner's use against the quotas (0: none).
	limit := func(s string, max int64) string {
		if max > 0 {
			return s + " of " + strconv.FormatInt(max, 10)
		}
		return s
	}
	for _, u := range l.Usage {
		quota := ""
		if u.MaxOwnBytes > 0 {
			quota = " of " + units.Bytes(u.MaxOwnBytes)
		}
		fmt.Fprintf(out, "owner %s: %s branches, %s of their own%s\n", u.Owner,
			limit(strconv.Itoa(u.Branches), int64(u.MaxBranches)), units.Bytes(u.OwnBytes), quota)
	}
	return nil
}

// lagText shows a standby source's lag (empty for other sources).
func lagText(l *branches.Lag) string {
	if l == nil {
		return ""
	}
	s := "lag " + units.Bytes(l.Bytes)
	if l.Seconds != nil {
		s += fmt.Sprintf(", %.1f s", *l.Seconds)
	}
	if strings.HasPrefix(l.Error, branches.NotStreaming) {
		return "ERROR: " + l.Error + " (" + s + ")"
	} else if l.Error != "" {
		return "lag unknown: " + l.Error
	}
	return s
}
