package branches

import (
	"context"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/statedir"
)

// localToken is the caller of a Local: it holds a NUL, which no HTTP
// header carries, so that no token given to a serve on the same state
// directory is it.
const localToken = "\x00pgfork-local"

// LocalOptions configure a Local.
type LocalOptions struct {
	Layout statedir.Layout
	// Sources are those the calls of this Local may name (a create from
	// a source, a snapshot of one): a Local keeps no sources between
	// processes, each names its own.
	Sources []Source
	// PGBin is a bin directory the user named (Options.PGBin).
	PGBin string
	// User runs the servers when pgfork is root (nil: the current user).
	User *instance.OSUser
	// Host is where branches listen on TCP (default 127.0.0.1).
	Host string
	// OnNotice is Options.OnNotice: the CLI prints it.
	OnNotice func(Notice)
}

// Local is the branches of one state directory used from the process that
// opens it, with no server (pgfork branch without --server): the same
// Manager serve uses, every call its owner's. Each data directory runs
// on an installation of its own major; no branch is started by opening
// (those not running are listed stopped until Start); one process holds
// the branches at a time (another gets an errs.Busy error: a serve with
// branches on the same state directory is asked over HTTP instead).
type Local struct{ m *Manager }

// OpenLocal opens the branches of o.Layout for this process.
func OpenLocal(ctx context.Context, o LocalOptions) (*Local, error) {
	for _, s := range o.Sources {
		if s.Kind == SourceStandby {
			return nil, errs.New(errs.Unsupported, "source %q is a standby: a standby is kept running by a server", s.Name).
				WithHint("declare it to pgfork serve and ask that server for the branch")
		}
	}
	m, err := Open(ctx, Options{Layout: o.Layout, Sources: o.Sources, PGBin: o.PGBin, User: o.User, Host: o.Host, LeaveStopped: true, OnNotice: o.OnNotice, BranchStore: true,
		AdminTokens: []string{localToken}})
	if err != nil {
		return nil, err
	}
	return &Local{m: m}, nil
}

var localCaller = Caller{Token: localToken}

// Close releases the branches; their servers keep running.
func (l *Local) Close() { l.m.Close() }

// Create makes and starts a branch (Manager.Create).
func (l *Local) Create(ctx context.Context, o CreateOptions) (Branch, error) {
	return l.m.Create(ctx, localCaller, o)
}

// List lists the snapshots and branches (Manager.List; no quotas, so no
// usage).
func (l *Local) List(context.Context) (ListResult, error) {
	res := l.m.List(localCaller)
	res.Usage = nil
	return res, nil
}

// Get returns one branch (Manager.Get).
func (l *Local) Get(_ context.Context, name string) (Branch, error) {
	return l.m.Get(localCaller, name)
}

// Reset puts a branch back to its snapshot (Manager.Reset).
func (l *Local) Reset(ctx context.Context, name string) (Branch, error) {
	return l.m.Reset(ctx, localCaller, name)
}

// Start starts a stopped branch (Manager.Start).
func (l *Local) Start(ctx context.Context, name string) (Branch, error) {
	return l.m.Start(ctx, localCaller, name)
}

// Stop stops a branch's server, keeping its data (Manager.Stop).
func (l *Local) Stop(ctx context.Context, name string) (Branch, error) {
	return l.m.Stop(ctx, localCaller, name)
}

// Protect protects a branch from deletion, or no longer (Manager.Protect).
func (l *Local) Protect(_ context.Context, name string, on bool) (Branch, error) {
	return l.m.Protect(localCaller, name, on)
}

// Delete deletes a branch (Manager.Delete).
func (l *Local) Delete(ctx context.Context, name string) error {
	return l.m.Delete(ctx, localCaller, name)
}

// Snapshot takes a named snapshot (Manager.CreateSnapshot).
func (l *Local) Snapshot(ctx context.Context, o SnapshotOptions) (Snapshot, error) {
	return l.m.CreateSnapshot(ctx, localCaller, o)
}

// DeleteSnapshot deletes a named snapshot (Manager.DeleteSnapshot).
func (l *Local) DeleteSnapshot(_ context.Context, name string) error {
	return l.m.DeleteSnapshot(localCaller, name)
}
