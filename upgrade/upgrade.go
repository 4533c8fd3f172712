// Package upgrade runs PostgreSQL major-version upgrades with pg_upgrade in
// the fastest transfer mode the disks allow, after a rehearsal on a
// copy-on-write clone of the old cluster.
//
// It finds what pg_upgrade needs and users get wrong: a new cluster
// initialized to match the old one (bootstrap superuser, encoding, locale,
// data checksums, WAL segment size), a transfer mode that works on these
// filesystems, enough free space, a stopped old cluster. It translates
// pg_upgrade's findings into plain words, keeps its logs on failure, and
// leaves the old cluster startable whenever the mode allows: the new cluster
// is built in a staging directory beside NEW_DATADIR and renamed into place
// only when the upgrade succeeded; a killed run's leftovers are cleaned by
// the next one.
//
// upgrade owns the orchestration of one major-version upgrade. It must not
// reimplement copying (clone, pgclone) or server handling (instance): it
// combines them.
package upgrade

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/pgdata"
)

// Mode is a pg_upgrade transfer mode, or Auto.
type Mode string

// Transfer modes. Link and Swap leave the old cluster unusable once the new
// one has started (Swap: as soon as the transfer began).
const (
	Auto          Mode = "auto"
	Clone         Mode = "clone"
	CopyFileRange Mode = "copy-file-range"
	Copy          Mode = "copy"
	Link          Mode = "link"
	Swap          Mode = "swap"
)

// Modes lists the modes a user may ask for.
var Modes = []Mode{Auto, Clone, CopyFileRange, Copy, Link, Swap}

// ParseMode returns the Mode named s, or a Usage error.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", errs.New(errs.Usage, "unknown upgrade mode %q", s).
		WithHint("use one of: auto, clone, copy-file-range, copy, link, swap")
}

// destructive reports whether the mode makes the old cluster unusable.
func (m Mode) destructive() bool { return m == Link || m == Swap }

// Rehearse says whether to rehearse the upgrade on a clone first.
type Rehearse int

// Rehearsal choices.
const (
	// RehearseAuto rehearses when the old cluster's filesystem can clone.
	RehearseAuto Rehearse = iota
	// RehearseOn always rehearses (on a full copy where cloning is not possible).
	RehearseOn
	// RehearseOff skips the rehearsal.
	RehearseOff
	// RehearseOnly rehearses and stops: the original is never written.
	RehearseOnly
)

// Options describe an upgrade.
type Options struct {
	OldDir, NewDir string
	// Old and New are the PostgreSQL builds (see FindInstalls).
	Old, New Install
	Mode     Mode // default Auto
	Jobs     int  // pg_upgrade --jobs and vacuumdb --jobs; default 1
	Rehearse Rehearse
	// CheckOnly runs pg_upgrade --check against a matching new cluster and
	// stops; nothing is left behind.
	CheckOnly bool
	// StopOld shuts a running old cluster down cleanly (fast) first.
	StopOld bool
	// Confirmed says the user accepted that link/swap make the old cluster
	// unusable (--yes). Otherwise Confirm is asked; nil Confirm refuses.
	Confirmed bool
	Confirm   func(warning string) bool
	// Superuser overrides the bootstrap superuser's name, when pgfork
	// cannot find it by connecting as postgres or the data dir's owner.
	Superuser string
	// NoAnalyze skips the statistics step after the upgrade.
	NoAnalyze bool
	// WaitAnalyze rebuilds statistics on the private socket and stops the
	// new cluster: without it, the new cluster is started for the
	// application first and left running (see Result.AcceptsAfter).
	WaitAnalyze bool
	// User runs PostgreSQL (nil: the current user).
	User *instance.OSUser
	// OnEvent receives progress; nil for none. Called from one goroutine at a time.
	OnEvent func(Event)
}

// Event is progress of an upgrade.
type Event struct {
	Phase string `json:"phase"`          // see the Phase* constants
	Step  string `json:"step,omitempty"` // pg_upgrade's step, within PhaseUpgrade/PhaseCheck/PhaseRehearsal
	Done  bool   `json:"done"`
	// Status is the step's result ("ok", "fatal"...), when Done.
	Status string `json:"status,omitempty"`
	// Bytes and TotalBytes: data transferred so far, while files are transferred.
	Bytes      int64  `json:"bytes,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
	Message    string `json:"message,omitempty"`
}

// Phases of an upgrade, in order.
const (
	PhasePrepare    = "prepare"    // versions, state, mode, space
	PhaseRehearsal  = "rehearsal"  // the whole upgrade on a clone
	PhaseStopOld    = "stop-old"   // fast shutdown of the old cluster after an online rehearsal
	PhaseSettings   = "settings"   // read the old cluster's settings
	PhaseInitDB     = "initdb"     // create the matching new cluster
	PhaseCheck      = "check"      // pg_upgrade --check
	PhaseUpgrade    = "upgrade"    // pg_upgrade
	PhaseStart      = "start"      // start the new cluster, smoke check
	PhaseStatistics = "statistics" // vacuumdb
)

// PhaseTime is how long a phase took.
type PhaseTime struct {
	Name    string        `json:"name"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Result describes a finished upgrade (or check, or rehearsal).
type Result struct {
	OldDir     string `json:"old_dir"`
	NewDir     string `json:"new_dir,omitempty"`
	OldVersion string `json:"old_version"`
	NewVersion string `json:"new_version"`
	Mode       Mode   `json:"mode"`
	// ModeReason says why auto chose the mode.
	ModeReason string              `json:"mode_reason,omitempty"`
	Control    *pgdata.ControlData `json:"control"`
	Catalog    *Catalog            `json:"catalog"`
	// Tablespaces of the old cluster.
	Tablespaces []Tablespace `json:"tablespaces,omitempty"`
	// Findings are pg_upgrade's warnings (and, on failure, its problems).
	Findings  []Finding  `json:"findings,omitempty"`
	Rehearsal *Rehearsal `json:"rehearsal,omitempty"`
	Steps     []Step     `json:"steps,omitempty"`
	// Bytes of user data transferred, and how they were transferred.
	Bytes       int64 `json:"bytes"`
	SharedBytes int64 `json:"shared_bytes"` // shared with the old cluster (clone, link, swap)
	CopiedBytes int64 `json:"copied_bytes"`
	// Statistics says what was run to rebuild optimizer statistics.
	Statistics string        `json:"statistics,omitempty"`
	Phases     []PhaseTime   `json:"phases"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	// Downtime is from the moment the old cluster stopped serving (the
	// start of the run when it was already stopped) until the new cluster
	// accepted the application's connections (handed over), or was
	// upgraded, checked, given statistics unless skipped and stopped, for
	// the user to start.
	Downtime time.Duration `json:"downtime_ns,omitempty"`
	// AcceptsAfter is from the start of the run until the new cluster
	// accepted the application's connections (started with its own
	// configuration before statistics were rebuilt), or until the run
	// ended (the user starts it); StatisticsAfter until statistics were
	// rebuilt (0: skipped).
	AcceptsAfter    time.Duration `json:"accepts_after_ns,omitempty"`
	StatisticsAfter time.Duration `json:"statistics_after_ns,omitempty"`
	// Running says pgfork left the new cluster running (handed over).
	Running bool `json:"running,omitempty"`
	// CatalogChanges are the changes to the old cluster's catalogs made
	// between the online rehearsal and its stop; Rechecked says pg_upgrade
	// --check then ran again before the real upgrade.
	CatalogChanges []string `json:"catalog_changes,omitempty"`
	Rechecked      bool     `json:"rechecked,omitempty"`
	// Notes are things the operator should know (configuration files, the
	// old cluster's fate).
	Notes []string `json:"notes,omitempty"`
	// CleanedUp lists leftovers of interrupted runs that were removed.
	CleanedUp []string `json:"cleaned_up,omitempty"`
	// CheckOnly and RehearsalOnly say the real upgrade was not run.
	CheckOnly     bool `json:"check_only,omitempty"`
	RehearsalOnly bool `json:"rehearsal_only,omitempty"`
}

// Rehearsal describes the rehearsal on a clone.
type Rehearsal struct {
	Mode    Mode          `json:"mode"`
	Dir     string        `json:"dir"`
	Phases  []PhaseTime   `json:"phases"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// Relations per database after the upgrade of the clone.
	Relations map[string]int64 `json:"relations"`
	// Online says the old cluster ran and served during the rehearsal,
	// which worked on an online clone of it (pg_backup_start/stop).
	Online bool `json:"online,omitempty"`
	// OriginalUnchanged says the original was verified unchanged
	// afterwards (every entry's type, size, mtime and link target); not
	// checked after an online rehearsal, as the running server writes it.
	OriginalUnchanged bool `json:"original_unchanged"`
}

// upgrader carries the state of one run.
type upgrader struct {
	o    Options
	res  *Result
	work *workspace
	t0   time.Time
	// down is when the old cluster stopped serving.
	down time.Time
	// oldPort is the port the old cluster ran on (0: it did not run).
	oldPort int
	// oldCfg is what a hand-over carries from the old cluster (see
	// carry); oldCfgErr why it cannot be read, for a stopped one (the
	// new cluster is then not handed over).
	oldCfg    *oldConfig
	oldCfgErr error
	// oldOpts are the running old server's command-line options
	// (postmaster.opts), to start it again as it ran after an interrupt.
	oldOpts string
	// handed: the new cluster was started for the application.
	handed bool
}

// hookBeforeStop, when set (by tests), runs after an online rehearsal
// passed and before the old cluster is stopped.
var hookBeforeStop func()

// testHook, when set (tests only), is called at the named steps where no
// progress event marks the state a test must kill pgfork in: a server
// running, a file being moved into place.
var testHook func(step string)

// hook calls testHook.
func hook(step string) {
	if testHook != nil {
		testHook(step)
	}
}

func (u *upgrader) emit(e Event) {
	if u.o.OnEvent != nil {
		u.o.OnEvent(e)
	}
}

func (u *upgrader) infof(phase, format string, args ...any) {
	u.emit(Event{Phase: phase, Message: fmt.Sprintf(format, args...)})
}

// phase times fn as the named phase.
func (u *upgrader) phase(name string, phases *[]PhaseTime, fn func() error) error {
	u.emit(Event{Phase: name})
	t := time.Now()
	err := fn()
	*phases = append(*phases, PhaseTime{Name: name, Elapsed: time.Since(t)})
	u.emit(Event{Phase: name, Done: true})
	return err
}

// Run upgrades the cluster in o.OldDir into o.NewDir.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Mode == "" {
		o.Mode = Auto
	}
	if _, err := ParseMode(string(o.Mode)); err != nil {
		return nil, err
	}
	if o.Jobs < 1 {
		o.Jobs = 1
	}
	var err error
	if o.OldDir, err = absDir(o.OldDir, "old data directory"); err != nil {
		return nil, err
	}
	if o.NewDir, err = absDir(o.NewDir, "new data directory"); err != nil {
		return nil, err
	}
	u := &upgrader{o: o, t0: time.Now(), res: &Result{OldDir: o.OldDir, NewDir: o.NewDir, Mode: o.Mode}}
	res, err := u.run(ctx)
	if err != nil && ctx.Err() != nil {
		err = u.afterInterrupt(err)
	}
	if res != nil {
		res.Elapsed = time.Since(u.t0)
	}
	return res, err
}

func absDir(p, what string) (string, error) {
	if p == "" {
		return "", errs.New(errs.Usage, "the %s is missing", what).WithCLI("see `pgfork upgrade --help`")
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", errs.Wrap(errs.Usage, err, "bad %s", what).WithPath(p)
	}
	return filepath.Clean(a), nil
}

// errorWithFindings turns a failed pg_upgrade into the user's error.
func errorWithFindings(what string, fs []Finding, logs string) error {
	kind := errs.Unsupported
	msg := what
	if len(fs) > 0 {
		msg += ":" + findingsText(fs)
	} else {
		kind = errs.Internal
	}
	e := errs.New(kind, "%s", msg)
	if logs != "" {
		return e.WithHint("pg_upgrade's output and logs are kept in %s; fix the problems above and run again", logs)
	}
	return e.WithHint("fix the problems above and run again")
}

// userDirMode is the mode of directories the PostgreSQL user works in.
const userDirMode = 0o700

func (u *upgrader) mkUserDir(p string) error {
	if err := u.o.User.MkdirOwned(p, userDirMode); err != nil {
		return errs.FromOS(err, p, "cannot create a work directory")
	}
	return nil
}

// pathFree refuses a NEW_DATADIR that exists: pgfork builds the new
// cluster beside it and renames it into place, so that it never half-exists.
func pathFree(p string) error {
	if _, err := os.Lstat(p); err != nil {
		return nil
	}
	e := errs.New(errs.Exists, "new data directory already exists").WithPath(p)
	if ents, err := os.ReadDir(p); err == nil && len(ents) == 0 {
		return e.WithHint("pgfork creates NEW_DATADIR itself: remove the empty directory, or, if it is a mount point, give a new subdirectory of it (e.g. %s)",
			filepath.Join(p, "data"))
	}
	return e.WithHint("choose a path that does not exist yet (pgfork creates it), or remove it if it is a leftover you do not need")
}
