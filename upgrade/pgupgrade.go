package upgrade

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
)

// Install is one PostgreSQL build used by an upgrade.
type Install struct {
	BinDir  string   `json:"bin_dir"`
	Version string   `json:"version"`
	Major   int      `json:"major"`
	Env     []string `json:"-"`
}

// tool returns the path of one of the build's programs.
func (i Install) tool(name string) string { return filepath.Join(i.BinDir, name) }

// pgUpgradeRun describes one pg_upgrade invocation.
type pgUpgradeRun struct {
	Old, New       Install
	OldDir, NewDir string
	Superuser      string
	Mode           Mode // transfer mode; ignored with Check
	Check          bool // --check only
	Jobs           int
	NoSync         bool
	WorkDir        string // cwd: pg_upgrade's sockets and delete script go here
	HBA            string // private pg_hba.conf for both servers ("" for none)
	// OldSettings are more settings for the old server (integers and
	// plain words only: they are not quoted).
	OldSettings map[string]string
	User        *instance.OSUser
	// Background runs pg_upgrade, and so the servers, pg_dump and
	// pg_restore it starts, at background priority (proc.LowerTree): the
	// online rehearsal, which shares the machine with the old cluster
	// serving its application.
	Background bool
	// OnStep is called when pg_upgrade starts a step (done false) and when
	// it reports its result (done true, status "ok", "fatal", "warning"...).
	OnStep func(step string, done bool, status string)
}

// pgUpgradeResult is what a pg_upgrade run printed, understood.
type pgUpgradeResult struct {
	Output   string
	Steps    []Step
	Findings []Finding
	// LogDir is the pg_upgrade_output.d run directory it wrote, if any.
	LogDir string
}

// Step is one pg_upgrade step and how it ended.
type Step struct {
	Name    string        `json:"name"`
	Status  string        `json:"status"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

func (r pgUpgradeRun) args() []string {
	a := []string{
		"--old-bindir", r.Old.BinDir, "--new-bindir", r.New.BinDir,
		"--old-datadir", r.OldDir, "--new-datadir", r.NewDir,
	}
	if r.Superuser != "" {
		a = append(a, "--username", r.Superuser)
	}
	if r.Jobs > 1 {
		a = append(a, "--jobs", strconv.Itoa(r.Jobs))
	}
	if r.HBA != "" {
		opt := "-c hba_file=" + r.HBA
		a = append(a, "--old-options", opt, "--new-options", opt)
	}
	keys := make([]string, 0, len(r.OldSettings))
	for k := range r.OldSettings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		a = append(a, "--old-options", "-c "+k+"="+r.OldSettings[k])
	}
	if r.Check {
		a = append(a, "--check")
	}
	if r.Mode != "" {
		a = append(a, "--"+string(r.Mode))
	}
	if r.NoSync {
		a = append(a, "--no-sync")
	} else if r.New.Major >= 17 && runtime.GOOS == "linux" {
		// One syncfs(2) per filesystem instead of an fsync per file: with
		// thousands of databases (hundreds of thousands of files) the
		// per-file sync was the largest step of the real run. Linux
		// reports write-back errors through syncfs since 5.8.
		a = append(a, "--sync-method=syncfs")
	}
	return a
}

// env merges the environments the two builds need (LD_LIBRARY_PATH for
// builds without a runpath), the new build's first.
func mergeEnv(a, b []string) []string {
	out := append([]string(nil), a...)
	for _, kv := range b {
		k, v, _ := strings.Cut(kv, "=")
		found := false
		for i, o := range out {
			if ok, ov, _ := strings.Cut(o, "="); ok == k {
				found = true
				if k == "LD_LIBRARY_PATH" || k == "PATH" {
					out[i] = k + "=" + ov + ":" + v
				}
			}
		}
		if !found {
			out = append(out, kv)
		}
	}
	return out
}

// run runs pg_upgrade, reporting its steps as they happen. pg_upgrade
// prints a step's name without a newline when it starts and "ok" (or
// "fatal"...) and a newline when it ends, so a partial line is a step in
// progress.
func (r pgUpgradeRun) run(ctx context.Context) (*pgUpgradeResult, error) {
	cmd := r.User.Command(ctx, mergeEnv(r.New.Env, r.Old.Env), r.New.tool("pg_upgrade"), r.args()...)
	cmd.Dir = r.WorkDir
	// Die with pgfork, even on kill -9; servers pg_upgrade started are
	// stopped by the cleanup of the next run.
	proc.DieWithParent(cmd)
	// A process group of its own: the terminal's Ctrl-C reaches pgfork
	// alone, which decides whether to stop pg_upgrade (cmd.Cancel) or,
	// once the old cluster is past the point of no return, to let it end.
	setpgid(cmd)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 30 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	res := &pgUpgradeResult{}
	var out bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		parseSteps(pr, &out, func(name string, done bool, status string, el time.Duration) {
			if done {
				res.Steps = append(res.Steps, Step{Name: name, Status: status, Elapsed: el})
			}
			if r.OnStep != nil {
				r.OnStep(name, done, status)
			}
		})
	}()
	if err := cmd.Start(); err != nil {
		pw.Close()
		wg.Wait()
		return nil, errs.Wrap(errs.Internal, err, "cannot run pg_upgrade").WithPath(r.New.tool("pg_upgrade"))
	}
	if r.Background {
		// pg_upgrade has just started: it checks its options and binaries
		// before it starts a server, which then inherits the priority.
		_ = proc.LowerTree(cmd.Process.Pid)
	}
	err := cmd.Wait()
	pw.Close()
	wg.Wait()
	res.Output = out.String()
	res.Findings = parseFindings(res.Output)
	res.LogDir = latestLogDir(r.NewDir)
	if err != nil {
		if ctx.Err() != nil {
			return res, errs.Wrap(errs.Interrupted, ctx.Err(), "pg_upgrade interrupted")
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return res, errs.Wrap(errs.Internal, err, "pg_upgrade failed")
		}
		return res, errPGUpgrade
	}
	return res, nil
}

// errPGUpgrade marks a pg_upgrade that ran and exited non-zero; the caller
// turns its findings into the error the user sees.
var errPGUpgrade = errors.New("pg_upgrade failed")

// parseSteps copies r into out and calls step for each step start and end
// (a start before every end, also when both came in one read).
func parseSteps(r io.Reader, out *bytes.Buffer, step func(name string, done bool, status string, el time.Duration)) {
	buf := make([]byte, 32<<10)
	var line []byte
	started := ""
	var t0 time.Time
	for {
		n, err := r.Read(buf)
		chunk := buf[:n]
		out.Write(chunk)
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				line = append(line, chunk...)
				break
			}
			line = append(line, chunk[:i]...)
			chunk = chunk[i+1:]
			if name, status, ok := stepLine(string(line)); ok {
				if started != name {
					// A step whose start and end came in one read (a fast
					// one) starts too: every step is seen starting before it
					// ends (an interrupt test waited for a start it never saw).
					t0 = time.Now()
					step(name, false, "", 0)
				}
				step(name, true, status, time.Since(t0))
			}
			started = ""
			line = line[:0]
		}
		if len(line) > 0 {
			if name := strings.TrimSpace(string(line)); name != "" && name != started && looksLikeStep(name) {
				started, t0 = name, time.Now()
				step(name, false, "", 0)
			}
		}
		if err != nil {
			return
		}
	}
}

// stepStatuses are the words pg_upgrade ends a step line with.
var stepStatuses = []string{"ok", "fatal", "warning", "skipped", "failed"}

// stepLine splits "Checking cluster versions      ok" into name and status.
func stepLine(s string) (name, status string, ok bool) {
	s = strings.TrimRight(s, " \r")
	i := strings.LastIndex(s, " ")
	if i < 0 {
		return "", "", false
	}
	status = s[i+1:]
	name = strings.TrimSpace(s[:i])
	for _, st := range stepStatuses {
		if status == st && looksLikeStep(name) && strings.HasSuffix(s[:i], "  ") {
			return name, status, true
		}
	}
	return "", "", false
}

func looksLikeStep(s string) bool {
	for _, p := range []string{"Checking", "Creating", "Setting", "Analyzing", "Freezing", "Deleting", "Copying",
		"Cloning", "Linking", "Moving", "Swapping", "Resetting", "Restoring", "Sync", "Adding", "Transferring", "Performing"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// latestLogDir returns the newest run directory under
// <newDir>/pg_upgrade_output.d, or "".
func latestLogDir(newDir string) string {
	base := filepath.Join(newDir, "pg_upgrade_output.d")
	ents, err := os.ReadDir(base)
	if err != nil || len(ents) == 0 {
		return ""
	}
	latest := ""
	for _, e := range ents {
		if e.IsDir() && e.Name() > latest {
			latest = e.Name()
		}
	}
	if latest == "" {
		return ""
	}
	return filepath.Join(base, latest)
}
