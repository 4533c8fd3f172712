package serve

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgfork/pgfork/branches"
	"github.com/pgfork/pgfork/server"
)

// BranchOptions turn on branches (docs/branches.md): the sources and
// guards; the layout, PostgreSQL build and OS user are Run's.
type BranchOptions struct {
	Sources     []branches.Source
	Tokens      []string // tokens that may use the branch routes (owners)
	AdminTokens []string // tokens that see and change every branch
	MaxBranches int
	// MaxOwnBytes bounds the disk one token's branches use of their own.
	MaxOwnBytes int64
	MinFree     int64
	// LeaveStopped: serve stops every branch when it exits and starts
	// none when it starts (each is started on demand); otherwise branches
	// keep running across a restart and those found stopped are started.
	LeaveStopped bool
	// SourceMaxAge is branches.Options.SourceMaxAge.
	SourceMaxAge time.Duration
	// Idle, when set, deletes branches with no session for this long.
	Idle time.Duration
	// Schedules take snapshots of sources periodically.
	Schedules []SnapshotSchedule
}

// SnapshotSchedule takes a snapshot of Source every Every, keeping the
// newest Keep (0: all).
type SnapshotSchedule struct {
	Source string
	Every  time.Duration
	Keep   int
}

// snapshotOnSchedule runs one schedule until ctx ends; a failed snapshot
// is logged and tried again at the next tick.
func snapshotOnSchedule(ctx context.Context, m *branches.Manager, s SnapshotSchedule, log *slog.Logger) {
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if snap, err := m.ScheduledSnapshot(ctx, s.Source, s.Keep); err != nil {
				log.Warn("scheduled snapshot failed", "source", s.Source, "err", err)
			} else {
				log.Info("scheduled snapshot", "source", s.Source, "name", snap.Name)
			}
		}
	}
}

// openBranches opens the branches Manager for Run.
func openBranches(ctx context.Context, o Options) (*branches.Manager, error) {
	inst, user, err := o.FindPG()
	if err != nil {
		return nil, err
	}
	bo := o.Branches
	return branches.Open(ctx, branches.Options{Layout: o.Layout, Sources: bo.Sources, Installation: inst, User: user,
		MaxBranches: bo.MaxBranches, MaxOwnBytes: bo.MaxOwnBytes, MinFree: bo.MinFree, LeaveStopped: bo.LeaveStopped,
		SourceMaxAge: bo.SourceMaxAge, AdminTokens: append(append([]string(nil), bo.AdminTokens...), o.Token),
		OnNotice: func(n branches.Notice) {
			if o.OnInfo != nil {
				o.OnInfo("warning: " + n.String())
			}
		}})
}

// expireBranches deletes branches whose TTL ran out (and, with idle set,
// those without a session for that long), every 30 seconds, until ctx ends.
func expireBranches(ctx context.Context, m *branches.Manager, idle time.Duration) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Expire(ctx)
			if idle > 0 {
				m.ExpireIdle(ctx, idle)
			}
		}
	}
}

// branchAPI is the server's view of a branches.Manager.
type branchAPI struct{ m *branches.Manager }

var _ server.Branches = branchAPI{}

func caller(token string) branches.Caller { return branches.Caller{Token: token} }

func (a branchAPI) List(token string) any { return a.m.List(caller(token)) }

func (a branchAPI) Get(token, name string) (any, error) { return a.m.Get(caller(token), name) }

func (a branchAPI) Create(ctx context.Context, token string, r server.BranchRequest) (any, error) {
	return a.m.Create(ctx, caller(token), branches.CreateOptions{Name: r.Name, Source: r.Source, Snapshot: r.Snapshot,
		From: r.From, TTL: r.TTL(), Protected: r.Protected})
}

func (a branchAPI) Reset(ctx context.Context, token, name string) (any, error) {
	return a.m.Reset(ctx, caller(token), name)
}

func (a branchAPI) Start(ctx context.Context, token, name string) (any, error) {
	return a.m.Start(ctx, caller(token), name)
}

func (a branchAPI) Stop(ctx context.Context, token, name string) (any, error) {
	return a.m.Stop(ctx, caller(token), name)
}

func (a branchAPI) Protect(token, name string, on bool) (any, error) {
	return a.m.Protect(caller(token), name, on)
}

func (a branchAPI) Delete(ctx context.Context, token, name string) error {
	return a.m.Delete(ctx, caller(token), name)
}

func (a branchAPI) Snapshot(ctx context.Context, token string, r server.SnapshotRequest) (any, error) {
	return a.m.CreateSnapshot(ctx, caller(token), branches.SnapshotOptions{Name: r.Name, Source: r.Source, Branch: r.Branch, Keep: r.Keep})
}

func (a branchAPI) DeleteSnapshot(token, name string) error {
	return a.m.DeleteSnapshot(caller(token), name)
}
