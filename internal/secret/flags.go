package secret

import (
	"fmt"
	"io"
	neturl "net/url"
	"os"
	"regexp"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/pgfork/pgfork/internal/errs"
)

// A secret is never on a command line (docs/SECURITY.md, rule 2): every
// local user reads every process's /proc/PID/cmdline (ps). The flags of
// pgfork that carry a secret are defined here, and Load is the one place
// that reads them, before any command runs:
//
//   - a secret of its own (a token, a password) is defined with Var or
//     ListVar: --NAME VALUE is refused, the value comes from a file of mode
//     0600 (--NAME-file FILE) or from an environment variable;
//   - a connection string (a URL or libpq key=value string, or a value that
//     holds one) is defined with ConnVar or marked with MarkConn: one that
//     holds a password is refused; the password goes where libpq finds it
//     (PGPASSWORD, a passfile, a service file).

// annotation marks a flag for Load; its value is the kind.
const annotation = "pgfork-secret"

const (
	kindSecret = "secret" // the value itself is a secret: refused on the command line
	kindConn   = "conn"   // a connection string: refused when it holds a password
)

// maxFile caps what a secret's file may hold.
const maxFile = 64 << 10

// fileValue is the --NAME-file flag of a secret: the file to read it
// from, and where it goes.
type fileValue struct {
	path  string
	name  string // the secret's flag, without "--"
	env   string // the environment variable that holds it instead
	dst   *string
	list  *[]string
	param string // how the secret is written in --help: TOKEN, PASSWORD
}

func (v *fileValue) String() string     { return v.path }
func (v *fileValue) Set(s string) error { v.path = s; return nil }
func (v *fileValue) Type() string       { return "file" }

// connValue is a connection-string flag whose value may come from an
// environment variable instead.
type connValue struct {
	dst *string
	env string
}

func (v *connValue) String() string     { return *v.dst }
func (v *connValue) Set(s string) error { *v.dst = s; return nil }
func (v *connValue) Type() string       { return "string" }

// Var defines a secret flag pair on fs: --NAME-FILE FILE, the file (mode
// 0600 or stricter) whose first line is the secret, and --NAME, hidden
// and refused by Load (it would put the secret on the command line).
// Without a file, Load takes the secret from the environment variable env.
// param names the secret in the help (TOKEN, PASSWORD); what says what it
// is for. dst receives the secret.
func Var(fs *pflag.FlagSet, dst *string, name, env, param, what string) {
	define(fs, &fileValue{name: name, env: env, dst: dst, param: param}, what)
}

// ListVar is Var for a list of secrets (repeatable tokens): the file holds
// one a line (blank lines and lines starting with # are skipped), the
// environment variable separates them with commas or spaces; --NAME
// VALUE is refused.
func ListVar(fs *pflag.FlagSet, dst *[]string, name, env, param, what string) {
	define(fs, &fileValue{name: name, env: env, list: dst, param: param}, what)
}

func define(fs *pflag.FlagSet, v *fileValue, what string) {
	read := "read it from `FILE` (mode 0600)"
	if v.list != nil {
		read = "read them from `FILE` (mode 0600), one a line,"
	}
	fs.Var(v, v.name+"-file", fmt.Sprintf("%s: %s or else from env %s (never --%s %s: every local user reads the command line)", what, read, v.env, v.name, v.param))
	_ = fs.SetAnnotation(v.name+"-file", annotation, []string{kindSecret})
	fs.String(v.name, "", "refused: use --"+v.name+"-file or env "+v.env)
	_ = fs.MarkHidden(v.name)
	_ = fs.SetAnnotation(v.name, annotation, []string{kindSecret})
}

// ConnVar defines a connection-string flag on fs that Load refuses when
// its value holds a password; without the flag, Load takes the value from
// the environment variable env (if env is not "").
func ConnVar(fs *pflag.FlagSet, dst *string, name, env, usage string) {
	fs.Var(&connValue{dst: dst, env: env}, name, usage)
	MarkConn(fs, name)
}

// MarkConn marks flag name of fs (already defined) as one whose values hold
// a connection string, or a value with one in it (standby:URL): Load refuses
// a value that holds a password.
func MarkConn(fs *pflag.FlagSet, name string) {
	if err := fs.SetAnnotation(name, annotation, []string{kindConn}); err != nil {
		panic(err) // a flag not defined: a programming error
	}
}

// IsSecretFlag reports whether flag f is defined or marked here: a flag
// Load checks.
func IsSecretFlag(f *pflag.Flag) bool { return len(f.Annotations[annotation]) > 0 }

// Load checks every flag of fs that this package defined or marked, and
// reads the secrets: a secret given on the command line (--NAME VALUE) or
// a connection string with a password in it is refused (errs.Usage, naming
// the file and environment forms); a secret comes from its --NAME-file, or
// else from its environment variable, read with lookupEnv. Commands call it
// once, after parsing and before they do anything.
func Load(fs *pflag.FlagSet, lookupEnv func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || !IsSecretFlag(f) {
			return
		}
		switch v := f.Value.(type) {
		case *fileValue:
			err = v.load(lookupEnv)
		case *connValue:
			if !f.Changed && v.env != "" {
				*v.dst, _ = lookupEnv(v.env)
			} else if f.Changed {
				err = checkConn(f.Name, *v.dst)
			}
		default:
			if !f.Changed {
				return
			}
			if f.Annotations[annotation][0] == kindSecret {
				file := fs.Lookup(f.Name + "-file").Value.(*fileValue)
				err = errs.New(errs.Usage, "--%s puts a secret on the command line, where every local user reads it (ps, /proc/PID/cmdline)", f.Name).
					WithHint("put it in the environment variable %s, or in a file of mode 0600 named by --%s-file", file.env, f.Name)
				return
			}
			vals := []string{f.Value.String()}
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				vals = sv.GetSlice()
			}
			for _, s := range vals {
				if err = checkConn(f.Name, s); err != nil {
					return
				}
			}
		}
	})
	return err
}

// checkConn refuses the value s of flag name when it holds a password.
func checkConn(name, s string) error {
	if !HasPassword(s) {
		return nil
	}
	return errs.New(errs.Usage, "--%s holds a password, and the command line is read by every local user (ps, /proc/PID/cmdline)", name).
		WithHint("leave the password out and give it where libpq finds it: a password file of mode 0600 (PGPASSFILE, ~/.pgpass, or passfile=FILE in the URL) or PGPASSWORD")
}

// load reads v's secret from its file, or else from its environment
// variable. A single secret is the file's one line, or the variable's
// whole value; a list is one a line in the file (blank lines and # lines
// skipped), separated by commas or spaces in the variable.
func (v *fileValue) load(lookupEnv func(string) (string, bool)) error {
	text, inFile := "", v.path != ""
	if inFile {
		b, err := ReadFile(v.path)
		if err != nil {
			return err
		}
		text = string(b)
	} else {
		text, _ = lookupEnv(v.env)
	}
	if v.list == nil {
		if inFile {
			text = strings.TrimRight(text, "\r\n")
			if strings.ContainsAny(text, "\r\n") {
				return errs.New(errs.Usage, "--%s-file %s holds more than one line: one %s is read from it", v.name, v.path, v.param).WithPath(v.path).
					WithHint("keep only the %s in the file, on one line", v.param)
			}
		}
		*v.dst = text
		return nil
	}
	sep := func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' }
	if inFile {
		sep = func(r rune) bool { return r == '\n' || r == '\r' }
	}
	var vals []string
	for _, s := range strings.FieldsFunc(text, sep) {
		if s = strings.TrimSpace(s); s != "" && !(inFile && strings.HasPrefix(s, "#")) {
			vals = append(vals, s)
		}
	}
	*v.list = vals
	return nil
}

// ReadFile reads a file that holds a secret: a regular file (no symlink
// followed) of at most 64 KiB that no other user may read (mode 0600 or
// stricter): a secret readable by everyone is no secret.
func ReadFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, errs.FromOS(err, path, "cannot read the secret's file")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, errs.FromOS(err, path, "cannot read the secret's file")
	}
	if !fi.Mode().IsRegular() {
		return nil, errs.New(errs.Usage, "%s is not a regular file", path).WithPath(path).WithHint("name a file that holds the secret")
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, errs.New(errs.Usage, "%s holds a secret but other users may read it (mode %04o)", path, fi.Mode().Perm()).WithPath(path).
			WithHint("chmod 600 %s", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, errs.FromOS(err, path, "cannot read the secret's file")
	}
	if len(b) > maxFile {
		return nil, errs.New(errs.Usage, "%s is larger than %d KiB: not a secret's file", path, maxFile>>10).WithPath(path).WithHint("name a file that holds the secret")
	}
	return b, nil
}

// keyPassword finds a password keyword in a libpq key=value string, or in
// one written after a prefix (standby:host=h password=p).
var keyPassword = regexp.MustCompile(`(^|[\s:])password\s*=`)

// HasPassword reports whether s, a connection string (a URL or a libpq
// key=value string) or a value that holds one after a prefix
// (NAME=standby:URL), holds a password: in the URL's user information or
// its password parameter, or a password keyword.
func HasPassword(s string) bool {
	if i := urlStart(s); i >= 0 {
		_, pw, err := SplitURLPassword(s[i:])
		return err != nil || pw != ""
	}
	return keyPassword.MatchString(s)
}

// urlStart is where the first URL (SCHEME://, postgres or http) begins in
// s, or -1.
func urlStart(s string) int {
	i := strings.Index(s, "://")
	if i < 0 {
		return -1
	}
	j := i
	for j > 0 && strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-", rune(s[j-1])) {
		j--
	}
	return j
}

// SplitURLPassword splits a URL into the URL without its password and the
// password ("" if it has none), from its user information or its password
// parameter. A passfile parameter is left out too: it names a file of this
// process's user, and whoever connects with the URL gets the password
// another way. The error never quotes the URL: it may hold a password.
// (pgdata.SplitPassword splits libpq's key=value strings too.)
func SplitURLPassword(conn string) (string, string, error) {
	u, err := neturl.Parse(conn)
	if err != nil {
		// url.Parse's error quotes the URL, password and all.
		return "", "", errs.New(errs.Usage, "not a valid URL")
	}
	var password string
	if u.User != nil {
		password, _ = u.User.Password()
		u.User = neturl.User(u.User.Username())
	}
	q := u.Query()
	if p := q.Get("password"); p != "" {
		password = p
	}
	if q.Has("password") || q.Has("passfile") {
		q.Del("password")
		q.Del("passfile")
		u.RawQuery = q.Encode()
	}
	return u.String(), password, nil
}
