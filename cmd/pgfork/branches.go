package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
)

// branchClient is `pgfork branch`'s link to a serve: one HTTP call per
// command (docs/branches.md).
type branchClient struct {
	server, token string
}

// call sends one request to serve's branch API and decodes the answer into
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

// apiBranch is a branch as the API answers it.
type apiBranch struct {
	Name      string    `json:"name"`
	From      string    `json:"from"`
	Snapshot  string    `json:"snapshot"`
	Owner     string    `json:"owner"`
	Created   time.Time `json:"created"`
	Protected bool      `json:"protected"`
	State     string    `json:"state"`
	Size      int64     `json:"size_bytes"`
	Shared    int64     `json:"shared_bytes"`
	URL       string    `json:"url"`
}

func (cl *cli) newBranchCmd() *cobra.Command {
	c := &branchClient{}
	cmd := &cobra.Command{
		Use:   "branch",
		Short: "Branches of a team's databases from a pgfork serve: create, ls, reset, rm",
		Long: `Ask a pgfork serve started with --branch-source for branches: a started
copy of a source (a running cluster or a backup chain), a snapshot or another
branch, with its own port, role and password. Each command is one call to the
server's /api/v2 API; the token you pass owns the branches you create.
See docs/branches.md.`,
		Example: `  pgfork branch create mine --source prod --server http://db1:5433 --token $T
  pgfork branch reset mine --server http://db1:5433 --token $T`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.server, "server", cl.getenv("PGFORK_SERVER"), "the pgfork serve to ask, http://HOST:PORT (env PGFORK_SERVER)")
	pf.StringVar(&c.token, "token", cl.getenv("PGFORK_TOKEN"), "your token (env PGFORK_TOKEN)")
	show := func(b apiBranch) error {
		if cl.g.json {
			return printJSON(cl.stdout, b)
		}
		fmt.Fprintln(cl.stdout, b.URL)
		return nil
	}
	esc := url.PathEscape

	var src, snap, from string
	var ttl time.Duration
	var protect bool
	create := &cobra.Command{
		Use: "create NAME (--source S | --snapshot S | --from BRANCH)", Short: "Create a branch and print its connection string",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var b apiBranch
			if err := c.call(cmd.Context(), "POST", "/api/v2/branches", map[string]any{"name": args[0], "source": src,
				"snapshot": snap, "from": from, "ttl_seconds": int64(ttl.Seconds()), "protected": protect}, &b); err != nil {
				return err
			}
			return show(b)
		},
	}
	create.Flags().StringVar(&src, "source", "", "a source the server declares")
	create.Flags().StringVar(&snap, "snapshot", "", "a snapshot")
	create.Flags().StringVar(&from, "from", "", "another branch of yours")
	create.Flags().DurationVar(&ttl, "ttl", 0, "delete it after this long (0: never)")
	create.Flags().BoolVar(&protect, "protect", false, "refuse to delete it until unprotected")

	ls := &cobra.Command{
		Use: "ls", Short: "List sources, snapshots and your branches", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var l struct {
				Sources   []map[string]any `json:"sources"`
				Snapshots []struct {
					Name    string    `json:"name"`
					From    string    `json:"from"`
					Created time.Time `json:"created"`
					Size    int64     `json:"size_bytes"`
					Shared  int64     `json:"shared_bytes"`
				} `json:"snapshots"`
				Branches []apiBranch `json:"branches"`
				Usage    []struct {
					Owner       string `json:"owner"`
					Branches    int    `json:"branches"`
					OwnBytes    int64  `json:"own_bytes"`
					MaxBranches int    `json:"max_branches"`
					MaxOwnBytes int64  `json:"max_own_bytes"`
				} `json:"usage"`
			}
			if err := c.call(cmd.Context(), "GET", "/api/v2/branches", nil, &l); err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cl.stdout, l)
			}
			w := tabwriter.NewWriter(cl.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "KIND\tNAME\tFROM\tOWN\tSHARED\tAGE\tURL")
			for _, s := range l.Sources {
				fmt.Fprintf(w, "source\t%v\t%v\t\t\t\t%s\n", s["name"], s["kind"], lagText(s["lag"]))
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
					time.Since(b.Created).Round(time.Second), b.URL)
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
				fmt.Fprintf(cl.stdout, "owner %s: %s branches, %s of their own%s\n", u.Owner,
					limit(strconv.Itoa(u.Branches), int64(u.MaxBranches)), units.Bytes(u.OwnBytes), quota)
			}
			return nil
		},
	}
	reset := &cobra.Command{
		Use: "reset NAME", Short: "Put a branch back to the point it was made from (same port and password)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var b apiBranch
			if err := c.call(cmd.Context(), "POST", "/api/v2/branches/"+esc(args[0])+"/reset", nil, &b); err != nil {
				return err
			}
			return show(b)
		},
	}
	onOff := func(verb, short string) *cobra.Command {
		return &cobra.Command{
			Use: verb + " NAME", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				var b apiBranch
				if err := c.call(cmd.Context(), "POST", "/api/v2/branches/"+esc(args[0])+"/"+verb, nil, &b); err != nil {
					return err
				}
				return show(b)
			},
		}
	}
	start := onOff("start", "Start a stopped branch (same port and password)")
	stop := onOff("stop", "Stop a branch's server, keeping its data (it stays stopped until started)")
	var keep int
	snapshot := &cobra.Command{
		Use: "snapshot BRANCH NAME", Short: "Take a named read-only snapshot of a branch", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s map[string]any
			if err := c.call(cmd.Context(), "POST", "/api/v2/branches/"+esc(args[0])+"/snapshot", map[string]any{"name": args[1], "keep": keep}, &s); err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cl.stdout, s)
			}
			fmt.Fprintln(cl.stdout, s["name"])
			return nil
		},
	}
	snapshot.Flags().IntVar(&keep, "keep", 0, "keep only your newest N snapshots of this branch (0: all; other tokens' are never removed)")
	var off bool
	protectCmd := &cobra.Command{
		Use: "protect NAME", Short: "Protect a branch from deletion (--off to allow it again)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			method := "POST"
			if off {
				method = "DELETE"
			}
			var b apiBranch
			if err := c.call(cmd.Context(), method, "/api/v2/branches/"+esc(args[0])+"/protect", nil, &b); err != nil {
				return err
			}
			return show(b)
		},
	}
	protectCmd.Flags().BoolVar(&off, "off", false, "remove the protection")
	var isSnap bool
	rm := &cobra.Command{
		Use: "rm NAME...", Short: "Delete branches (or snapshots, with --snapshot)", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := "branches"
			if isSnap {
				kind = "snapshots"
			}
			for _, n := range args {
				if err := c.call(cmd.Context(), "DELETE", "/api/v2/"+kind+"/"+esc(n), nil, nil); err != nil {
					return err
				}
			}
			return nil
		},
	}
	rm.Flags().BoolVar(&isSnap, "snapshot", false, "the names are snapshots")
	cmd.AddCommand(create, ls, reset, start, stop, snapshot, protectCmd, rm)
	return cmd
}

// lagText shows a standby source's lag as the API answers it (empty for
// other sources).
func lagText(v any) string {
	l, ok := v.(map[string]any)
	if !ok {
		return ""
	}
	b, _ := l["bytes"].(float64)
	s := "lag " + units.Bytes(int64(b))
	if sec, ok := l["seconds"].(float64); ok {
		s += fmt.Sprintf(", %.1f s", sec)
	}
	if e, _ := l["error"].(string); strings.HasPrefix(e, branches.NotStreaming) {
		return "ERROR: " + e + " (" + s + ")"
	} else if e != "" {
		return "lag unknown: " + e
	}
	return s
}
