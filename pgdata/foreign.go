package pgdata

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/safefs"
)

// A foreign setting is one by which a cluster's configuration makes its
// server load code, run a command, or read and write files outside its
// data directory. A cluster pgfork starts from data it did not write (a
// clone, a branch, a standby of someone else's primary, a restored backup,
// an upgrade's rehearsal) runs with each of them reset to a safe value
// (ForeignOverrides): whoever wrote the data (its owner, its superusers, a
// primary's administrator) must not choose what the server runs.
type foreignSetting struct {
	// always: every supported major (13+) knows the setting, so it is
	// overridden even when no configuration file sets it (a file the
	// parser here reads otherwise than the server cannot slip it through).
	// Others are overridden only when set (the server refuses names it does
	// not know).
	always bool
	// safe returns the value to run with, given the configured one (""
	// when unset).
	safe func(v string) string
}

// ForeignSettings lists every setting ForeignOverrides resets, the one
// list of settings that load code, run commands, or name files outside
// the data directory (PostgreSQL 13 to 18, postgresql.conf.sample):
//
//   - libraries: shared_preload_libraries, session_preload_libraries,
//     local_preload_libraries, oauth_validator_libraries keep only plain
//     names (loaded from the installation's own $libdir), jit_provider too
//     (else llvmjit), dynamic_library_path is '$libdir' and
//     extension_control_path '$system';
//   - commands: archive_command, archive_library, restore_command,
//     archive_cleanup_command, recovery_end_command, ssl_passphrase_command
//     are empty;
//   - files: external_pid_file is empty; hba_file, ident_file, log_directory,
//     stats_temp_directory, promote_trigger_file and the ssl_* files must
//     name a place inside the data directory (relative, without ".."), else
//     get their default (and ssl is off when an ssl_* file was reset);
//     log_filename must not name a directory.
//
// include, include_if_exists and include_dir must name files inside the
// data directory, configuration files must not be symlinks, and
// data_directory must not be set (ForeignOverrides refuses them).
// unix_socket_directories, listen_addresses and port are pgfork's choice
// on every server's command line (instance.Start).
var ForeignSettings = func() []string {
	var names []string
	for n := range foreign {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}()

var (
	plainLibrary = regexp.MustCompile(`^(\$libdir/)?[A-Za-z0-9_][A-Za-z0-9_.+-]*$`)
	plainName    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.+-]*$`)
)

// libraries keeps the plain library names of a list setting: loaded from
// the installation's own $libdir (dynamic_library_path is reset too),
// never from a path the data's writer chose.
func libraries(v string) string {
	var kept []string
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if strings.HasPrefix(e, `"`) && strings.HasSuffix(e, `"`) && len(e) >= 2 {
			e = strings.ReplaceAll(e[1:len(e)-1], `""`, `"`)
		}
		if plainLibrary.MatchString(e) && !strings.Contains(e, "..") {
			kept = append(kept, e)
		}
	}
	return strings.Join(kept, ", ")
}

func empty(string) string { return "" }

// inside keeps a path setting that names a place inside the data directory
// (relative, no ".."), else gives def.
func inside(def string) func(string) string {
	return func(v string) string {
		if v == "" || filepath.IsAbs(v) || v == ".." || strings.HasPrefix(v, "../") || strings.Contains(v, "/../") || strings.HasSuffix(v, "/..") {
			return def
		}
		return v
	}
}

var foreign = map[string]foreignSetting{
	"shared_preload_libraries":  {true, libraries},
	"session_preload_libraries": {true, libraries},
	"local_preload_libraries":   {true, libraries},
	"oauth_validator_libraries": {false, libraries},
	"dynamic_library_path":      {true, func(string) string { return "$libdir" }},
	"extension_control_path":    {false, func(string) string { return "$system" }},
	"jit_provider": {true, func(v string) string {
		if plainName.MatchString(v) && !strings.Contains(v, "..") {
			return v
		}
		return "llvmjit"
	}},
	"archive_command":         {true, empty},
	"archive_library":         {false, empty},
	"restore_command":         {true, empty},
	"archive_cleanup_command": {true, empty},
	"recovery_end_command":    {true, empty},
	"ssl_passphrase_command":  {true, empty},
	"external_pid_file":       {true, empty},
	"hba_file":                {false, inside("pg_hba.conf")},
	"ident_file":              {false, inside("pg_ident.conf")},
	"log_directory":           {false, inside("log")},
	"log_filename": {false, func(v string) string {
		if strings.Contains(v, "/") {
			return "postgresql-%Y-%m-%d_%H%M%S.log"
		}
		return v
	}},
	"stats_temp_directory": {false, inside("pg_stat_tmp")},
	"promote_trigger_file": {false, inside("")},
	"ssl_cert_file":        {false, inside("server.crt")},
	"ssl_key_file":         {false, inside("server.key")},
	"ssl_ca_file":          {false, inside("")},
	"ssl_crl_file":         {false, inside("")},
	"ssl_crl_dir":          {false, inside("")},
	"ssl_dh_params_file":   {false, inside("")},
}

// ForeignOverrides reads the configuration of dataDir as its server would
// (postgresql.conf with the files it includes, in order, then
// postgresql.auto.conf with its own) and returns the value to run with for
// each setting of ForeignSettings that is unsafe there, or that is always
// reset: for the caller to append to postgresql.auto.conf (ResetForClone,
// in a copy no one else can reach yet) or to put on the server's command
// line, which wins over every file (cluster.StartBranch, the start of
// every branch, clone, restore and standby). It is a parse of a few small
// files, no server is run.
//
// It refuses (errs.Unsupported) what it cannot make safe by a setting: an
// include of a file outside the data directory (the server would read a
// file another user may write), a configuration file that is a symlink,
// data_directory set (the server would run on another data directory).
// Files are read below the data directory's descriptor without following
// a symlink (safefs).
func ForeignOverrides(dataDir string) (map[string]string, error) {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, errs.FromOS(err, dataDir, "bad data directory path")
	}
	d, err := safefs.OpenDir(dataDir)
	if err != nil {
		return nil, errs.FromOS(err, dataDir, "cannot open the data directory")
	}
	defer d.Close()
	set := map[string]string{}
	refuse := func(rel, format string, a ...any) error {
		return errs.New(errs.Unsupported, format, a...).WithPath(filepath.Join(dataDir, rel)).
			WithHint("pgfork starts a cluster made from data it did not write only with a configuration inside its data directory: copy the file into it (or remove the setting) in the source, then copy again")
	}
	var read func(rel string, depth int, missingOK bool) error
	read = func(rel string, depth int, missingOK bool) error {
		if depth > 10 {
			return refuse(rel, "configuration files nested too deeply (include loop?)")
		}
		b, err := d.ReadFile(rel, 16<<20)
		switch {
		case errors.Is(err, os.ErrNotExist) && missingOK:
			return nil
		case errors.Is(err, safefs.ErrSymlink):
			return refuse(rel, "the configuration file %s is a symlink (or lies below one)", rel)
		case errors.Is(err, safefs.ErrNotRegular):
			return refuse(rel, "the configuration file %s is not a regular file", rel)
		case err != nil:
			return errs.FromOS(err, filepath.Join(dataDir, rel), "cannot read a configuration file")
		}
		for _, l := range strings.Split(string(b), "\n") {
			name, value, ok := parseConfLine(l)
			if !ok {
				continue
			}
			switch name {
			case "include", "include_if_exists", "include_dir":
				r, ok := relBelow(dataDir, resolveInclude(filepath.Join(dataDir, rel), value))
				if !ok {
					return refuse(rel, "%s includes %s (%s), outside the data directory", rel, value, name)
				}
				if name != "include_dir" {
					if err := read(r, depth+1, name == "include_if_exists"); err != nil {
						return err
					}
					continue
				}
				f, err := d.Open(r)
				if errors.Is(err, safefs.ErrSymlink) {
					return refuse(r, "the configuration directory %s is a symlink (or lies below one)", r)
				}
				if err != nil {
					return errs.FromOS(err, filepath.Join(dataDir, r), "cannot read a configuration directory")
				}
				ents, err := f.ReadDir(-1)
				f.Close()
				if err != nil {
					return errs.FromOS(err, filepath.Join(dataDir, r), "cannot read a configuration directory")
				}
				sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
				for _, e := range ents {
					if n := e.Name(); !strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".conf") && !e.IsDir() {
						if err := read(filepath.Join(r, n), depth+1, false); err != nil {
							return err
						}
					}
				}
			default:
				set[name] = value
			}
		}
		return nil
	}
	for _, f := range []string{"postgresql.conf", "postgresql.auto.conf"} {
		if err := read(f, 0, true); err != nil {
			return nil, err
		}
	}
	if v, ok := set["data_directory"]; ok {
		return nil, refuse("postgresql.conf", "the configuration sets data_directory = %s: the server would run on another data directory", QuoteConf(v))
	}
	out := map[string]string{}
	ssl := false
	for name, s := range foreign {
		v, ok := set[name]
		if !ok && !s.always {
			continue
		}
		if safe := s.safe(v); s.always || safe != v {
			out[name] = safe
			ssl = ssl || (strings.HasPrefix(name, "ssl_") && name != "ssl_passphrase_command" && safe != v)
		}
	}
	if ssl {
		out["ssl"] = "off"
	}
	return out, nil
}

// ForeignConf renders overrides as lines of postgresql.auto.conf, sorted.
func ForeignConf(overrides map[string]string) string {
	keys := make([]string, 0, len(overrides))
	for k := range overrides {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + " = " + QuoteConf(overrides[k]) + "\n")
	}
	return b.String()
}

// OpenLinkedDir opens, for root to copy, the directory a link of the data
// directory points to (pg_tblspc/OID, a pg_wal made by initdb --waldir):
// the one check of every copy that follows such a link. The directory must
// belong to the data directory's owner and be writable by no one else, and
// every directory on the way to it must belong to root or that owner and be
// writable by no one else (or be sticky, as /tmp is): a link planted by the
// data's owner (or by the PostgreSQL OS user in a running source) must not
// make root copy a directory the owner cannot read into a tree the owner
// gets. It is opened from / without following any symlink (the target is
// resolved first), and the opened directory is checked, so a name swapped
// after the check reaches nothing else. Callers read it through its
// descriptor (/proc/self/fd/N), never by name again. link names the link
// in errors. Not root, it opens the target as it is: pgfork then reads
// with its own rights only.
func OpenLinkedDir(dataDir, link, target string) (*os.File, error) {
	if os.Geteuid() != 0 {
		f, err := os.Open(target)
		if err != nil {
			return nil, errs.FromOS(err, target, "cannot open the directory %s links to", link)
		}
		return f, nil
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		return nil, errs.FromOS(err, dataDir, "cannot read the data directory's owner")
	}
	owner := fi.Sys().(*syscall.Stat_t).Uid
	refuse := func(p, format string, a ...any) error {
		return errs.New(errs.Permission, "%s of %s points to %s: "+format, append([]any{link, dataDir, target}, a...)...).WithPath(p).
			WithHint("a linked directory must belong to the data directory's owner (uid %d) and be writable by no one else, nor any directory on its path; repoint the link", owner)
	}
	resolved, err := filepath.EvalSymlinks(target)
	if err != nil {
		return nil, errs.FromOS(err, target, "cannot resolve %s", link)
	}
	if !filepath.IsAbs(resolved) {
		return nil, refuse(target, "a relative path")
	}
	p := "/"
	for _, part := range append([]string{""}, strings.Split(strings.TrimPrefix(resolved, "/"), "/")...) {
		p = filepath.Join(p, part)
		st, err := lstatOwner(p)
		if err != nil {
			return nil, errs.FromOS(err, p, "cannot check the directory %s links to", link)
		}
		last := p == resolved
		switch {
		case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
			return nil, refuse(p, "%s is not a directory", p)
		case last && st.Uid != owner:
			return nil, refuse(p, "it belongs to uid %d", st.Uid)
		case st.Uid != 0 && st.Uid != owner:
			return nil, refuse(p, "%s on its path belongs to uid %d", p, st.Uid)
		case st.Mode&0o022 != 0 && (last || st.Mode&syscall.S_ISVTX == 0):
			return nil, refuse(p, "%s is writable by other users (mode %o)", p, st.Mode&0o7777)
		}
	}
	root, err := safefs.OpenDir("/")
	if err != nil {
		return nil, errs.FromOS(err, "/", "cannot open /")
	}
	defer root.Close()
	f, err := root.Open(strings.TrimPrefix(resolved, "/"))
	if err != nil {
		return nil, errs.FromOS(err, resolved, "cannot open the directory %s links to", link)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR || st.Uid != owner || st.Mode&0o022 != 0 {
		f.Close()
		if err != nil {
			return nil, errs.FromOS(err, resolved, "cannot check the directory %s links to", link)
		}
		return nil, refuse(resolved, "the directory opened is not the one checked (uid %d, mode %o)", st.Uid, st.Mode&0o7777)
	}
	return f, nil
}

func lstatOwner(p string) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: p, Err: err}
	}
	return &st, nil
}
