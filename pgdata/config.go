package pgdata

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/pgfork/pgfork/clone"
	"github.com/pgfork/pgfork/internal/errs"
)

// ConfigFiles says where a cluster keeps a configuration that is not in its
// data directory (Debian and Ubuntu keep it in /etc/postgresql/MAJOR/CLUSTER).
type ConfigFiles struct {
	// ConfigFile is the server's postgresql.conf.
	ConfigFile string `json:"config_file"`
	// HBAFile and IdentFile are its pg_hba.conf and pg_ident.conf.
	HBAFile   string `json:"hba_file"`
	IdentFile string `json:"ident_file"`
	// FoundBy says how they were found: "--config-dir", "SHOW config_file"
	// or "Debian layout".
	FoundBy string `json:"found_by"`
}

// ConfigCopy describes the configuration CopyConfig put into a clone.
type ConfigCopy struct {
	ConfigFiles
	// Files are the files written into the clone, relative to it.
	Files []string `json:"files"`
	// CommentedOut lists the settings commented out, as "FILE:LINE NAME"
	// with FILE relative to the clone.
	CommentedOut []string `json:"commented_out,omitempty"`
	// Warnings are things the user should know, e.g. an include left
	// pointing outside the clone.
	Warnings []string `json:"warnings,omitempty"`
}

// outsideSettings name files of the source cluster: a clone that kept them
// would use the source's data directory, authentication files or pid file.
// CopyConfig comments them out, so the clone's own defaults (all inside its
// data directory, or none) apply. stats_temp_directory (before 15) would
// share the source's statistics files.
var outsideSettings = map[string]string{
	"data_directory":       "it names the source's data directory",
	"config_file":          "it names the source's configuration file",
	"hba_file":             "it names the source's pg_hba.conf; the clone uses its own copy",
	"ident_file":           "it names the source's pg_ident.conf; the clone uses its own copy",
	"external_pid_file":    "the clone would overwrite the source's pid file",
	"stats_temp_directory": "the clone would share the source's statistics files",
}

// HasOwnConfig reports whether dataDir holds its own postgresql.conf.
func HasOwnConfig(dataDir string) bool {
	_, err := os.Lstat(filepath.Join(dataDir, "postgresql.conf"))
	return err == nil
}

// DebianConfigDir returns the configuration directory the Debian/Ubuntu
// packaging uses for dataDir (/var/lib/postgresql/MAJOR/CLUSTER →
// /etc/postgresql/MAJOR/CLUSTER), or "" when dataDir is not laid out so or
// that directory holds no postgresql.conf.
func DebianConfigDir(dataDir string) string { return debianConfigDir("/", dataDir) }

func debianConfigDir(root, dataDir string) string {
	rel, err := filepath.Rel(filepath.Join(root, "var", "lib", "postgresql"), dataDir)
	if err != nil {
		return ""
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) != 2 || parts[0] == ".." || parts[0] == "." || parts[1] == "" {
		return ""
	}
	dir := filepath.Join(root, "etc", "postgresql", parts[0], parts[1])
	if _, err := os.Stat(filepath.Join(dir, "postgresql.conf")); err != nil {
		return ""
	}
	return dir
}

// ConfigInDir returns the configuration kept in dir for the cluster whose
// data directory is dataDir: dir/postgresql.conf, and the pg_hba.conf and
// pg_ident.conf it names (hba_file, ident_file; default in dir). When
// postgresql.conf sets data_directory, it must be dataDir (errs.Usage
// otherwise): the configuration of another cluster is no use to this one.
func ConfigInDir(dir, dataDir, foundBy string) (*ConfigFiles, error) {
	main := filepath.Join(dir, "postgresql.conf")
	if _, err := os.Stat(main); err != nil {
		return nil, errs.Wrap(errs.NotFound, err, "no postgresql.conf in the configuration directory").WithPath(dir).
			WithHint("give the directory that holds the cluster's postgresql.conf, e.g. /etc/postgresql/15/main")
	}
	settings, err := ReadConfigSettings(main)
	if err != nil {
		return nil, err
	}
	abs := func(v string) string {
		if filepath.IsAbs(v) {
			return v
		}
		return filepath.Join(dir, v)
	}
	if dd := settings["data_directory"]; dd != "" {
		a, err1 := os.Stat(abs(dd))
		b, err2 := os.Stat(dataDir)
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			return nil, errs.New(errs.Usage, "%s is the configuration of the cluster at %s, not of %s", main, abs(dd), dataDir).WithPath(main).
				WithHint("give the configuration directory of the cluster you clone")
		}
	}
	cf := &ConfigFiles{ConfigFile: main, HBAFile: filepath.Join(dir, "pg_hba.conf"), IdentFile: filepath.Join(dir, "pg_ident.conf"), FoundBy: foundBy}
	if v := settings["hba_file"]; v != "" {
		cf.HBAFile = abs(v)
	}
	if v := settings["ident_file"]; v != "" {
		cf.IdentFile = abs(v)
	}
	return cf, nil
}

// ReadConfigSettings returns the settings of a postgresql.conf and of the
// files it includes (include, include_if_exists, include_dir), the last
// one of each name winning, as the server reads them. Names are lower case.
func ReadConfigSettings(path string) (map[string]string, error) {
	out := map[string]string{}
	var read func(p string, depth int) error
	read = func(p string, depth int) error {
		if depth > 10 {
			return errs.New(errs.Usage, "configuration files nested too deeply (include loop?)").WithPath(p)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return configErr(err, p)
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, value, ok := parseConfLine(line)
			if !ok {
				continue
			}
			switch name {
			case "include", "include_if_exists":
				t := resolveInclude(p, value)
				if _, err := os.Stat(t); err != nil && name == "include_if_exists" {
					continue
				}
				if err := read(t, depth+1); err != nil {
					return err
				}
			case "include_dir":
				files, err := confDirFiles(resolveInclude(p, value))
				if err != nil {
					return err
				}
				for _, f := range files {
					if err := read(f, depth+1); err != nil {
						return err
					}
				}
			default:
				out[name] = value
			}
		}
		return nil
	}
	return out, read(path, 0)
}

// CopyConfig copies the configuration cf into the clone's data directory
// dst: postgresql.conf, the files it includes that live in its directory
// (Debian's conf.d, at the same relative place, so relative includes keep
// working), pg_hba.conf and pg_ident.conf. Settings that would point the
// clone at the source's files (data_directory, config_file, hba_file,
// ident_file, external_pid_file, stats_temp_directory) are commented out
// with a "# pgfork clone:" note; an include of a file outside the
// configuration directory is kept, pointing at the source's file (read
// only), with a warning. The source's files are only read. Files written
// are 0600 and belong to owner when it is set.
func CopyConfig(cf ConfigFiles, dst string, owner *clone.Owner) (*ConfigCopy, error) {
	c := &configCopier{dst: dst, srcDir: filepath.Dir(cf.ConfigFile), owner: owner, seen: map[string]bool{},
		res: &ConfigCopy{ConfigFiles: cf}}
	if err := c.copyConf(cf.ConfigFile, "postgresql.conf", 0); err != nil {
		return nil, err
	}
	for _, f := range []struct{ src, name string }{{cf.HBAFile, "pg_hba.conf"}, {cf.IdentFile, "pg_ident.conf"}} {
		b, err := os.ReadFile(f.src)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && f.name == "pg_ident.conf" {
				c.res.Warnings = append(c.res.Warnings, fmt.Sprintf("the source's %s (%s) does not exist; the clone has none", f.name, f.src))
				continue
			}
			return nil, configErr(err, f.src)
		}
		if err := c.write(f.name, b); err != nil {
			return nil, err
		}
	}
	return c.res, nil
}

type configCopier struct {
	dst, srcDir string
	owner       *clone.Owner
	seen        map[string]bool
	res         *ConfigCopy
}

// copyConf copies the configuration file src to rel in the clone, comments
// out the settings in outsideSettings and follows its includes.
func (c *configCopier) copyConf(src, rel string, depth int) error {
	if depth > 10 {
		return errs.New(errs.Usage, "configuration files nested too deeply (include loop?)").WithPath(src)
	}
	if c.seen[rel] {
		return nil
	}
	c.seen[rel] = true
	b, err := os.ReadFile(src)
	if err != nil {
		return configErr(err, src)
	}
	lines := strings.SplitAfter(string(b), "\n")
	var out strings.Builder
	for i, line := range lines {
		name, value, ok := parseConfLine(line)
		if !ok {
			out.WriteString(line)
			continue
		}
		if why, bad := outsideSettings[name]; bad {
			fmt.Fprintf(&out, "# pgfork clone: commented out, %s\n#%s", why, line)
			c.res.CommentedOut = append(c.res.CommentedOut, fmt.Sprintf("%s:%d %s", rel, i+1, name))
			continue
		}
		if name != "include" && name != "include_if_exists" && name != "include_dir" {
			out.WriteString(line)
			continue
		}
		target := resolveInclude(src, value)
		inside, err := filepath.Rel(c.srcDir, target)
		if err != nil || inside == ".." || strings.HasPrefix(inside, ".."+string(filepath.Separator)) {
			// Outside the configuration directory: read from where it is.
			if !filepath.IsAbs(value) {
				fmt.Fprintf(&out, "# pgfork clone: made absolute, it is outside the configuration directory\n%s = %s\n", name, QuoteConf(target))
			} else {
				out.WriteString(line)
			}
			c.res.Warnings = append(c.res.Warnings, fmt.Sprintf("%s (line %d) includes %s, outside the configuration directory: the clone reads the source's file", rel, i+1, target))
			continue
		}
		// Inside: copied to the same place relative to the clone's
		// postgresql.conf; an absolute path becomes relative.
		if filepath.IsAbs(value) {
			r, _ := filepath.Rel(filepath.Dir(filepath.Join(c.dst, rel)), filepath.Join(c.dst, inside))
			fmt.Fprintf(&out, "# pgfork clone: was %s, now the clone's copy\n%s = %s\n", QuoteConf(value), name, QuoteConf(r))
		} else {
			out.WriteString(line)
		}
		switch name {
		case "include_dir":
			files, err := confDirFiles(target)
			if err != nil {
				return err
			}
			if err := c.mkdirs(inside); err != nil {
				return err
			}
			for _, f := range files {
				if err := c.copyConf(f, filepath.Join(inside, filepath.Base(f)), depth+1); err != nil {
					return err
				}
			}
		default:
			if _, err := os.Stat(target); err != nil && name == "include_if_exists" {
				continue
			}
			if err := c.copyConf(target, inside, depth+1); err != nil {
				return err
			}
		}
	}
	return c.write(rel, []byte(out.String()))
}

// mkdirs creates the directory rel (and its parents) inside the clone,
// replacing anything in the way that is not a real directory (a symlink
// copied from the source would lead writes out of the clone).
func (c *configCopier) mkdirs(rel string) error {
	p := c.dst
	for _, part := range strings.Split(filepath.Clean(rel), string(filepath.Separator)) {
		if part == "." || part == "" {
			continue
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if err == nil && fi.IsDir() {
			continue
		}
		if err == nil {
			if err := os.RemoveAll(p); err != nil {
				return configErr(err, p)
			}
		}
		if err := os.Mkdir(p, 0o700); err != nil {
			return configErr(err, p)
		}
		if c.owner != nil {
			if err := os.Lchown(p, c.owner.UID, c.owner.GID); err != nil {
				return configErr(err, p)
			}
		}
	}
	return nil
}

// write creates rel in the clone with content, replacing what the data
// copy may have put there (never writing through a symlink).
func (c *configCopier) write(rel string, content []byte) error {
	if err := c.mkdirs(filepath.Dir(rel)); err != nil {
		return err
	}
	p := filepath.Join(c.dst, rel)
	if fi, err := os.Lstat(p); err == nil {
		if fi.IsDir() {
			return errs.New(errs.Unsupported, "the clone has a directory where its configuration file goes").WithPath(p)
		}
		if err := os.Remove(p); err != nil {
			return configErr(err, p)
		}
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return configErr(err, p)
	}
	_, err = f.Write(content)
	if err == nil && c.owner != nil {
		err = f.Chown(c.owner.UID, c.owner.GID)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return configErr(err, p)
	}
	c.res.Files = append(c.res.Files, rel)
	return nil
}

// parseConfLine returns the setting on one line of a PostgreSQL
// configuration file ("name = value", "name value", value quoted or not,
// "#" comments), its name in lower case.
func parseConfLine(line string) (name, value string, ok bool) {
	s := strings.TrimLeft(line, " \t\r\f\v")
	i := 0
	for i < len(s) && (s[i] == '_' || s[i] == '.' || s[i] >= 0x80 || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (i > 0 && s[i] >= '0' && s[i] <= '9')) {
		i++
	}
	if i == 0 {
		return "", "", false
	}
	name = strings.ToLower(s[:i])
	s = strings.TrimLeft(s[i:], " \t\r\f\v")
	s = strings.TrimPrefix(s, "=")
	s = strings.TrimLeft(s, " \t\r\f\v")
	if strings.HasPrefix(s, "'") {
		var v strings.Builder
		for j := 1; j < len(s); j++ {
			switch {
			case s[j] == '\'' && j+1 < len(s) && s[j+1] == '\'':
				v.WriteByte('\'')
				j++
			case s[j] == '\'':
				return name, v.String(), true
			case s[j] == '\\' && j+1 < len(s):
				j++
				switch s[j] {
				case 'n':
					v.WriteByte('\n')
				case 't':
					v.WriteByte('\t')
				case 'r':
					v.WriteByte('\r')
				default:
					v.WriteByte(s[j])
				}
			default:
				v.WriteByte(s[j])
			}
		}
		return name, v.String(), true // unterminated: the server refuses it
	}
	end := strings.IndexAny(s, " \t\r\n#")
	if end < 0 {
		end = len(s)
	}
	return name, s[:end], true
}

// QuoteConf quotes a value for postgresql.conf or postgresql.auto.conf as
// ALTER SYSTEM does: in single quotes, with ' doubled and \ doubled (the
// file's parser reads backslash escapes in quoted values). The one quoting
// of settings pgfork writes.
func QuoteConf(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", "''") + "'"
}

// resolveInclude resolves an include's target as the server does: relative
// to the directory of the file that includes it.
func resolveInclude(from, target string) string {
	if filepath.IsAbs(target) {
		return filepath.Clean(target)
	}
	return filepath.Join(filepath.Dir(from), target)
}

// confDirFiles lists what include_dir reads: the *.conf files of dir not
// starting with a dot, in name order.
func confDirFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, configErr(err, dir)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ".conf") || e.IsDir() {
			continue
		}
		out = append(out, filepath.Join(dir, n))
	}
	sort.Strings(out)
	return out, nil
}

func configErr(err error, p string) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errs.Wrap(errs.NotFound, err, "a configuration file is missing").WithPath(p)
	case errors.Is(err, fs.ErrPermission):
		return errs.Wrap(errs.OSKind(err), err, "cannot read or write a configuration file").WithPath(p).
			WithHint("run pgfork as root or as the cluster's owner")
	case errs.OSKind(err) == errs.NoSpace:
		return errs.FromOS(err, p, "cannot write a configuration file")
	}
	return errs.FromOS(err, p, "configuration file")
}
