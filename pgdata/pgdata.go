package pgdata

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/proc"
)

// Check reports whether dir looks like a PostgreSQL data directory: it must
// hold PG_VERSION and global/pg_control. A missing directory is
// errs.NotFound; anything else that is not a data directory is errs.Usage.
func Check(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return statErr(err, dir, "no such directory", "check the path of the data directory")
	}
	if !fi.IsDir() {
		return errs.New(errs.Usage, "not a PostgreSQL data directory (not a directory)").WithPath(dir).
			WithHint("give the data directory itself (the one holding PG_VERSION), e.g. /var/lib/postgresql/15/main")
	}
	for _, f := range []string{"PG_VERSION", filepath.Join("global", "pg_control")} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			if errors.Is(err, os.ErrPermission) {
				return statErr(err, dir, "", "")
			}
			return errs.New(errs.Usage, "not a PostgreSQL data directory (no %s)", f).WithPath(dir).
				WithHint("give the data directory itself (the one holding PG_VERSION), e.g. /var/lib/postgresql/15/main")
		}
	}
	return nil
}

func statErr(err error, p, msg, hint string) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return errs.Wrap(errs.NotFound, err, "%s", msg).WithPath(p).WithHint("%s", hint)
	case errors.Is(err, os.ErrPermission):
		return errs.Wrap(errs.OSKind(err), err, "cannot read the data directory").WithPath(p).
			WithHint("run pgfork as the data directory's owner (or root)")
	}
	return errs.FromOS(err, p, "cannot read the data directory")
}

// Version returns the major version of the PostgreSQL that made dataDir,
// from its PG_VERSION file ("15" → 15). Pre-10 directories ("9.6") are
// errs.Unsupported.
func Version(dataDir string) (int, error) {
	p := filepath.Join(dataDir, "PG_VERSION")
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, serr := os.Stat(dataDir); serr != nil {
				return 0, statErr(serr, dataDir, "no such directory", "check the path of the data directory")
			}
			return 0, errs.New(errs.Usage, "not a PostgreSQL data directory (no PG_VERSION)").WithPath(dataDir).
				WithHint("give the data directory itself (the one holding PG_VERSION)")
		}
		return 0, statErr(err, p, "", "")
	}
	s := strings.TrimSpace(string(b))
	if strings.HasPrefix(s, "9.") || strings.HasPrefix(s, "8.") || strings.HasPrefix(s, "7.") {
		return 0, errs.New(errs.Unsupported, "PostgreSQL %s data directories are not supported (pgfork needs 10 or newer)", s).WithPath(dataDir).
			WithHint("upgrade the cluster with pg_upgrade first")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 10 || n > 999 {
		return 0, errs.New(errs.Usage, "PG_VERSION holds %q, not a PostgreSQL major version", s).WithPath(p).
			WithHint("the data directory looks damaged; check the path")
	}
	return n, nil
}

// Tablespace is one entry of pg_tblspc.
type Tablespace struct {
	// OID is the tablespace's OID, the name of its pg_tblspc entry.
	OID string `json:"oid"`
	// Target is where the pg_tblspc/<oid> symlink points (an absolute path
	// as CREATE TABLESPACE writes it); empty for an in-place tablespace.
	Target string `json:"target,omitempty"`
	// InPlace is true for a tablespace stored as a directory inside
	// pg_tblspc (allow_in_place_tablespaces); it is copied with the data dir.
	InPlace bool `json:"in_place,omitempty"`
}

// Tablespaces lists the tablespaces of dataDir from the entries of
// pg_tblspc, ordered by OID. Entries that are not OIDs are ignored (the
// server ignores them too).
func Tablespaces(dataDir string) ([]Tablespace, error) {
	dir := filepath.Join(dataDir, "pg_tblspc")
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if cerr := Check(dataDir); cerr != nil {
				return nil, cerr
			}
			return nil, nil
		}
		return nil, statErr(err, dir, "", "")
	}
	var out []Tablespace
	for _, e := range ents {
		if !isOID(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return nil, errs.Wrap(errs.Internal, err, "cannot read the tablespace link").WithPath(p)
			}
			out = append(out, Tablespace{OID: e.Name(), Target: t})
		case e.IsDir():
			out = append(out, Tablespace{OID: e.Name(), InPlace: true})
		}
	}
	// ReadDir sorts by name; order numerically.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && oidLess(out[j].OID, out[j-1].OID); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

func isOID(s string) bool {
	if s == "" || len(s) > 10 {
		return false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && n > 0 && strconv.FormatUint(n, 10) == s
}

func oidLess(a, b string) bool {
	x, _ := strconv.ParseUint(a, 10, 32)
	y, _ := strconv.ParseUint(b, 10, 32)
	return x < y
}

// Running reads postmaster.pid and reports whether the process it names is
// alive (kill(pid, 0) succeeds or is refused with EPERM). No postmaster.pid
// means not running. A stale file (its process gone) reports the pid and
// false. Like PostgreSQL itself, it cannot tell a recycled pid from the
// postmaster, so it errs on the side of "running".
func Running(dataDir string) (pid int, running bool, err error) {
	p := filepath.Join(dataDir, "postmaster.pid")
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, serr := os.Stat(dataDir); serr != nil {
				return 0, false, statErr(serr, dataDir, "no such directory", "check the path of the data directory")
			}
			return 0, false, nil
		}
		return 0, false, statErr(err, p, "", "")
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		// A postmaster that is just starting writes the file in steps.
		return 0, true, nil
	}
	pid, err = strconv.Atoi(line)
	if err != nil {
		return 0, false, errs.New(errs.Internal, "postmaster.pid starts with %q, not a process id", line).WithPath(p).
			WithHint("if no server runs on this data directory, remove the file")
	}
	if pid < 0 {
		pid = -pid // a standalone backend writes -pid
	}
	if pid == 0 {
		return 0, false, nil
	}
	// proc.Alive refuses pids outside 1..pid_max, which kill(2) would
	// truncate (2^32+N is N) or read as a process group.
	return pid, proc.Alive(pid), nil
}
