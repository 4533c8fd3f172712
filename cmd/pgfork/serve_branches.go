package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/internal/units"
	"github.com/pgfork/pgfork/serve"
)

// branchFlags are serve's flags for branches (docs/branches.md).
type branchFlags struct {
	sources, tokens, admins []string
	quota                   int
	minFree                 string
	diskQuota               string
	restart                 string
	idle                    time.Duration
	sourceMaxAge            time.Duration
	schedules               []string
}

func addBranchFlags(f *pflag.FlagSet) *branchFlags {
	b := &branchFlags{}
	f.StringArrayVar(&b.sources, "branch-source", nil, "serve branches of [NAME=]cluster:DATADIR (a running cluster), [NAME=]standby:PRIMARY_URL (a standby kept here; the URL without its password, which is read from passfile= in the URL, PGPASSFILE, ~/.pgpass or PGPASSWORD) or [NAME=]backup:CHAINDIR[@BACKUP] (a chain of pgfork backup; add ,wal=DIR,target-name=N or target-time= or target-lsn= for a point in time); NAME defaults to the path's last element; repeatable")
	secret.MarkConn(f, "branch-source")
	secret.ListVar(f, &b.tokens, "branch-token", "PGFORK_BRANCH_TOKENS", "TOKEN", "tokens that may create and see their own branches (the token of --token-file is an admin token)")
	secret.ListVar(f, &b.admins, "branch-admin-token", "PGFORK_BRANCH_ADMIN_TOKENS", "TOKEN", "tokens that see and change every branch")
	f.IntVar(&b.quota, "branch-quota", 0, "branches one token may have at once (0: no limit)")
	f.StringVar(&b.diskQuota, "branch-disk-quota", "0", "disk one token's branches may use of their own (not shared with their source); past it, its creates are refused (0: no limit)")
	f.StringVar(&b.restart, "branch-restart", "start", "what serve does with branches when it restarts: start (they keep running when serve exits; those found stopped are started) or stopped (stopped when serve exits, left stopped until `pgfork branch start`)")
	f.StringVar(&b.minFree, "branch-min-free", "1GiB", "refuse to create branches and snapshots below this much free space")
	f.StringArrayVar(&b.schedules, "branch-snapshot-every", nil, "SOURCE=DURATION[,keep=N]: snapshot a source that often, keeping the newest N (repeatable)")
	f.DurationVar(&b.idle, "branch-idle", 0, "delete a branch no session used for this long (checked every 30 s; 0: never)")
	f.DurationVar(&b.sourceMaxAge, "branch-source-max-age", branches.DefaultSourceMaxAge, "a branch created from a source shares the snapshot of that source another branch was made from at most this long ago, instead of taking its own (0: each takes its own, as of its create)")
	return b
}

// options are the serve.BranchOptions the flags give (nil: no branches).
func (b *branchFlags) options() (*serve.BranchOptions, error) {
	if len(b.sources) == 0 {
		if len(b.tokens)+len(b.admins) > 0 {
			return nil, errs.New(errs.Usage, "branch tokens without a source").WithCLI("add --branch-source NAME=cluster:DATADIR")
		}
		return nil, nil
	}
	o := &serve.BranchOptions{Tokens: b.tokens, AdminTokens: b.admins, MaxBranches: b.quota, Idle: b.idle, SourceMaxAge: b.sourceMaxAge}
	if b.sourceMaxAge < 0 {
		return nil, errs.New(errs.Usage, "bad --branch-source-max-age %s", b.sourceMaxAge).WithHint("give 0 or more")
	}
	if b.quota < 0 {
		return nil, errs.New(errs.Usage, "bad --branch-quota %d", b.quota).WithHint("give 0 or more")
	}
	for _, tok := range append(append([]string(nil), b.tokens...), b.admins...) {
		if len(tok) < 16 {
			return nil, errs.New(errs.Usage, "a branch token is %d characters; it must have at least 16", len(tok)).
				WithHint("generate one: openssl rand -hex 16")
		}
	}
	n, err := units.ParseBytes(b.minFree)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad --branch-min-free %q", b.minFree)
	}
	o.MinFree = n
	switch b.restart {
	case "start":
	case "stopped":
		o.LeaveStopped = true
	default:
		return nil, errs.New(errs.Usage, "bad --branch-restart %q", b.restart).WithHint("use start or stopped")
	}
	if b.diskQuota != "0" {
		if o.MaxOwnBytes, err = units.ParseBytes(b.diskQuota); err != nil {
			return nil, errs.Wrap(errs.Usage, err, "bad --branch-disk-quota %q", b.diskQuota).WithHint("give a size such as 20GiB, or 0 for no limit")
		}
	}
	for _, s := range b.sources {
		src, err := branches.ParseSource(s)
		if err != nil {
			return nil, errs.Wrap(errs.Usage, err, "bad --branch-source").WithCLI("--branch-source %s", branches.SourceSyntax)
		}
		o.Sources = append(o.Sources, src)
	}
	for _, sc := range b.schedules {
		name, spec, _ := strings.Cut(sc, "=")
		every, keep, _ := strings.Cut(spec, ",")
		d, err := time.ParseDuration(every)
		sch := serve.SnapshotSchedule{Source: name, Every: d}
		if keep != "" {
			n, kerr := strconv.Atoi(strings.TrimPrefix(keep, "keep="))
			if kerr != nil || n < 0 || !strings.HasPrefix(keep, "keep=") {
				err = errs.New(errs.Usage, "bad keep")
			}
			sch.Keep = n
		}
		found := false
		for _, s := range o.Sources {
			found = found || s.Name == name
		}
		if err != nil || d < time.Minute || !found {
			return nil, errs.New(errs.Usage, "bad --branch-snapshot-every %q", sc).
				WithCLI("SOURCE=DURATION[,keep=N]: a declared source, at least 1m")
		}
		o.Schedules = append(o.Schedules, sch)
	}
	return o, nil
}
