package main

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgfork/pgfork/internal/pgtest"
	"github.com/pgfork/pgfork/internal/secret"
)

// secretish names flags that could carry a secret: each must be defined or
// marked by internal/secret (docs/SECURITY.md, rule 2), or be listed in
// notSecret with the reason.
var secretish = regexp.MustCompile(`token|passw|secret|url|conn|dsn|server|source|primary|key|auth|cred`)

// notSecret are flags whose names look like secretish but that never hold
// a secret.
var notSecret = map[string]string{
	"branch-source-max-age": "a duration",
	"max-conns":             "a number of HTTP connections",
}

// TestNoSecretFlagOnCommandLine (rule 2, G8): every flag of every pgfork
// command that can carry a secret goes through internal/secret, and the
// root's PersistentPreRunE (the one place every command passes) refuses
// it on the command line: a secret flag exits 2 naming its file and
// environment forms, a connection string with a password exits 2 naming
// libpq's password file — before the command does anything.
func TestNoSecretFlagOnCommandLine(t *testing.T) {
	root := newRootCmd(streams{})
	const tok = "s3cret-0123456789abcdef"
	tried := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.PersistentPreRunE != nil && c != root || c.PersistentPreRun != nil {
			t.Errorf("%s has a PersistentPreRun of its own: it would replace the root's, which refuses secrets on the command line", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.Runnable() || c.Hidden {
			return
		}
		path := strings.Fields(c.CommandPath())[1:]
		flags := pflag.NewFlagSet("", pflag.ContinueOnError)
		flags.AddFlagSet(c.LocalFlags())
		flags.AddFlagSet(c.InheritedFlags())
		flags.VisitAll(func(f *pflag.Flag) {
			if !secret.IsSecretFlag(f) {
				if secretish.MatchString(f.Name) && notSecret[f.Name] == "" {
					t.Errorf("%s --%s may carry a secret but is not defined through internal/secret (secret.Var, ListVar, ConnVar or MarkConn)", c.CommandPath(), f.Name)
				}
				return
			}
			var args []string
			var want []string
			switch {
			case strings.HasSuffix(f.Name, "-file"):
				return // the file form: tried below with its secret flag
			case f.Hidden: // --NAME of secret.Var: refused
				file := flags.Lookup(f.Name + "-file")
				if file == nil {
					t.Errorf("%s --%s: no --%s-file", c.CommandPath(), f.Name, f.Name)
					return
				}
				env := regexp.MustCompile(`env ([A-Z_]+)`).FindStringSubmatch(file.Usage)
				if env == nil {
					t.Errorf("%s --%s-file: its help names no environment variable: %s", c.CommandPath(), f.Name, file.Usage)
					return
				}
				args, want = []string{"--" + f.Name, tok}, []string{"--" + f.Name, "command line", env[1], "--" + f.Name + "-file"}
			default: // a connection string (or a value holding one)
				v := "postgresql://repl:" + tok + "@db.example:5432/postgres"
				if f.Name == "branch-source" || f.Name == "source" {
					v = "prod=standby:" + v
				}
				args, want = []string{"--" + f.Name, v}, []string{"--" + f.Name, "password", "PGPASSFILE"}
			}
			tried[c.CommandPath()+" --"+f.Name] = true
			args = append(append([]string(nil), path...), args...)
			home := t.TempDir()
			// As many placeholder arguments as the command takes (its
			// argument checks come before the flags' and say so).
			var r cliResult
			for n := 0; n <= 3; n++ {
				r = runInProcessEnv(t, []string{"PGFORK_HOME=" + home}, args...)
				if !regexp.MustCompile(`bad arguments|bad command line|missing|requires at least|accepts`).MatchString(r.stderr) {
					break
				}
				args = append(args, "placeholder")
			}
			for _, w := range want {
				if r.code != 2 || !strings.Contains(r.stderr, w) {
					t.Errorf("pgfork %s: exit %d, want 2 naming %q:\n%s%s", strings.Join(args, " "), r.code, w, r.stdout, r.stderr)
					break
				}
			}
			if ents, _ := os.ReadDir(home); len(ents) > 0 {
				t.Errorf("pgfork %s: wrote into the state directory before refusing", strings.Join(args, " "))
			}
			// The same value with its password left out is not refused for
			// being a secret (it may fail later for other reasons).
			if !f.Hidden {
				args[len(path)+1] = strings.Replace(args[len(path)+1], "repl:"+tok+"@", "repl@", 1)
				if r := runInProcessEnv(t, []string{"PGFORK_HOME=" + home}, args...); strings.Contains(r.stderr, "holds a password") {
					t.Errorf("pgfork %s: refused without a password:\n%s", strings.Join(args, " "), r.stderr)
				}
			}
		})
	}
	walk(root)
	// Every secret flag named in the issue was found and tried.
	for _, want := range []string{"pgfork serve --token", "pgfork serve --branch-token", "pgfork serve --branch-admin-token",
		"pgfork serve --branch-source", "pgfork serve --test-password", "pgfork serve --pg-url", "pgfork branch create --token",
		"pgfork branch create --source", "pgfork branch ls --server", "pgfork backup --url", "pgfork clone --url", "pgfork db create --url"} {
		if !tried[want] {
			t.Errorf("%s was not tried", want)
		}
	}
	if t.Failed() {
		keys := make([]string, 0, len(tried))
		for k := range tried {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Logf("tried: %s", strings.Join(keys, ", "))
	}
}

// TestSecretFiles: a secret's file must be a regular file no other user
// may read; one secret is its one line, a list one a line.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	load := func(args ...string) (string, []string, error) {
		fs := pflag.NewFlagSet("", pflag.ContinueOnError)
		var one string
		var list []string
		secret.Var(fs, &one, "token", "T_ENV", "TOKEN", "a token")
		secret.ListVar(fs, &list, "branch-token", "L_ENV", "TOKEN", "tokens")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"T_ENV": "from env", "L_ENV": "a, b c"}
		err := secret.Load(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		return one, list, err
	}
	if one, list, err := load(); err != nil || one != "from env" || strings.Join(list, "|") != "a|b|c" {
		t.Errorf("from the environment: %q %q %v", one, list, err)
	}
	good := write("good", "tok en\n", 0o600)
	many := write("many", "# tokens\nx\n\ny\r\n", 0o400)
	if one, list, err := load("--token-file", good, "--branch-token-file", many); err != nil || one != "tok en" || strings.Join(list, "|") != "x|y" {
		t.Errorf("from files: %q %q %v", one, list, err)
	}
	for _, c := range []struct{ args []string }{
		{[]string{"--token-file", write("open", "x\n", 0o644)}},
		{[]string{"--token-file", write("group", "x\n", 0o640)}},
		{[]string{"--token-file", write("two", "x\ny\n", 0o600)}},
		{[]string{"--token-file", dir}},
		{[]string{"--token-file", filepath.Join(dir, "missing")}},
		{[]string{"--token", "x"}},
		{[]string{"--branch-token", "x"}},
	} {
		if _, _, err := load(c.args...); err == nil {
			t.Errorf("%v: accepted", c.args)
		}
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if _, _, err := load("--token-file", link); err == nil {
		t.Error("a symlink to a secret's file: accepted")
	}
	for s, want := range map[string]bool{
		"postgresql://u:p@h/db":                       true,
		"postgresql://u@h/db?password=p":              true,
		"prod=standby:postgres://u:p@h/db":            true,
		"host=h user=u password=p":                    true,
		"prod=standby:host=h password='a b'":          true,
		"http://admin:tok@serve:5000":                 true,
		"postgresql://u@h/db?passfile=/etc/pgpass":    false,
		"prod=standby:host=h user=u passfile=/x":      false,
		"prod=cluster:/var/lib/postgresql/data":       false,
		"host=/run/postgresql user=u dbname=password": false,
		"http://serve:5000":                           false,
	} {
		if got := secret.HasPassword(s); got != want {
			t.Errorf("HasPassword(%q) = %v, want %v", s, got, want)
		}
	}
}

// procWatch records the command line of every process on the host, again
// and again, until stopped: a secret on any of them, even of a process
// that lived for a moment (pg_basebackup), is seen with luck; one on a
// process that lives on (serve, its servers, a watchdog) always.
type procWatch struct {
	mu   sync.Mutex
	seen map[string]string // command line -> pid
	stop chan struct{}
	done chan struct{}
}

func watchProcs() *procWatch {
	w := &procWatch{seen: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			w.sweep()
			select {
			case <-w.stop:
				w.sweep()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *procWatch) sweep() {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		line := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		w.mu.Lock()
		w.seen[line] = e.Name()
		w.mu.Unlock()
	}
}

// leaks stops w and returns each command line seen that holds one of
// secrets.
func (w *procWatch) leaks(secrets ...string) []string {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for line, pid := range w.seen {
		for _, s := range secrets {
			if strings.Contains(line, s) {
				out = append(out, fmt.Sprintf("pid %s holds %q: %s", pid, s, line))
			}
		}
	}
	return out
}

// processTree is pid and its descendants, each "PID: COMMAND LINE".
func processTree(pid int) []string {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 1 {
				parent[p], _ = strconv.Atoi(f[1])
			}
		}
	}
	in := map[int]bool{pid: true}
	for grew := true; grew; {
		grew = false
		for p, pp := range parent {
			if in[pp] && !in[p] {
				in[p], grew = true, true
			}
		}
	}
	var out []string
	for p := range in {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
		out = append(out, fmt.Sprintf("%d: %s", p, bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
	}
	sort.Strings(out)
	return out
}

// TestServeSecretsOffCommandLine (rule 2, G3/G8; the scan the issue asks
// for): pgfork serve in each documented configuration — the pool with a
// token; branch sources with branch and admin tokens; a standby source
// whose primary wants a replication password — first with every secret on
// its command line as the docs used to say (refused: exit 2 before
// anything starts), then with each from the environment or a 0600 file.
// While each serve starts, serves and makes a branch (its managed
// PostgreSQL, the standby's pg_basebackup and server, branch servers), the
// command line of every process on the host is read again and again: no
// secret is on any of them.
func TestServeSecretsOffCommandLine(t *testing.T) {
	t.Parallel() // see TestMain
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("KNOWN SKIP: no /proc")
	}
	bin, pgBin, dir, src := branchSource(t)
	const (
		admin     = "scan-admin-0123456789abcdef"
		alice     = "scan-alice-0123456789abcdef"
		boss      = "scan-boss-0123456789abcdefgh"
		replMark  = "scan-Repl-pw-0123456789"
		poolToken = "scan-pool-0123456789abcdef"
	)
	// A primary whose repl role needs its password (scram), for the standby.
	primary := filepath.Join(dir, "primary")
	srv := pgtest.Server{BinDir: pgBin, Settings: map[string]string{"wal_level": "replica", "full_page_writes": "on", "password_encryption": "scram-sha-256"}}
	pgtest.InitDB(t, primary, srv)
	hba := "local replication repl scram-sha-256\nlocal all repl scram-sha-256\nlocal all all trust\nlocal replication all trust\n"
	if err := os.WriteFile(filepath.Join(primary, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	in := pgtest.Start(t, primary, srv)
	pgtest.Exec(t, in.ConnString("", ""), "CREATE TABLE t (id int)", "CREATE ROLE repl LOGIN REPLICATION PASSWORD '"+replMark+"'",
		"GRANT pg_read_all_settings TO repl", "GRANT SELECT ON t TO repl")
	u, err := url.Parse(in.ConnString("", ""))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("repl")
	replURL := u.String()
	u.User = url.UserPassword("repl", replMark)
	replURLWithPassword := u.String()
	passfile := filepath.Join(dir, "primary.pgpass")
	if err := os.WriteFile(passfile, []byte("*:*:*:repl:"+replMark+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(adminFile, []byte(admin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := []string{admin, alice, boss, replMark, poolToken}

	for _, c := range []struct {
		name string
		// old: the command line as documented before rule 2 (refused)
		old []string
		// env, args: the same with the secrets in the environment or files
		env, args []string
		// branch: create a branch of this source with alice's token
		branch string
	}{
		{name: "pool with a token",
			old: []string{"--token", poolToken},
			env: []string{"PGFORK_TOKEN=" + poolToken}},
		{name: "branch sources with branch and admin tokens",
			old: []string{"--token", admin, "--branch-token", alice, "--branch-admin-token", boss, "--branch-source", "prod=cluster:" + src},
			env: []string{"PGFORK_BRANCH_TOKENS=" + alice, "PGFORK_BRANCH_ADMIN_TOKENS=" + boss},
			// --token-file: the admin token from a file
			args:   []string{"--token-file", adminFile, "--branch-source", "prod=cluster:" + src},
			branch: "prod"},
		{name: "a standby source whose primary wants a password",
			old:    []string{"--token", admin, "--branch-token", alice, "--branch-source", "replica=standby:" + replURLWithPassword},
			env:    []string{"PGFORK_TOKEN=" + admin, "PGFORK_BRANCH_TOKENS=" + alice, "PGPASSFILE=" + passfile},
			args:   []string{"--branch-source", "replica=standby:" + replURL},
			branch: "replica"},
	} {
		t.Run(c.name, func(t *testing.T) {
			home := filepath.Join(dir, "home-"+strings.ReplaceAll(c.name, " ", "-"))
			// The old command line: refused before anything starts (the
			// refused process had them on its command line, for a moment:
			// the one who typed them put them there).
			oldHome := home + "-old"
			t.Cleanup(func() { runInProcess(t, "--state-dir", oldHome, "down", "--all") })
			base, code, stderr := serveOrExit(t, bin, oldHome, pgBin, nil, append([]string{"--branch-min-free", "1MiB"}, c.old...)...)
			if base != "" {
				t.Errorf("serve with its secrets on the command line started (%s), and showed them to every local user for as long as it ran", base)
			} else if code != 2 || !strings.Contains(stderr, "command line") {
				t.Errorf("serve with its secrets on the command line: exit %d, want 2 naming the command line:\n%s", code, stderr)
			}
			if hasManaged(oldHome) {
				t.Error("serve with its secrets on the command line created a cluster before refusing")
			}

			w := watchProcs()
			args := append(c.args, "--branch-min-free", "1MiB")
			if c.branch != "" {
				// Branches and the standby stop with serve; down --all
				// stops whatever is left.
				args = append(args, "--branch-restart", "stopped")
				t.Cleanup(func() { runInProcess(t, "--state-dir", home, "down", "--all") })
			}
			s := startServe(t, bin, home, pgBin, c.env, args...)
			tok := poolToken
			if c.branch != "" {
				tok = admin
				if r := branchCLI(t, s.base, alice, "create", "scan", "--source", c.branch); r.code != 0 {
					t.Fatalf("alice creates a branch of %s: exit %d\n%s\nserve's log:\n%s", c.branch, r.code, r.stderr, s.stderr)
				}
			}
			if code, _, body := branchAPI(t, s.base, "GET", "/healthz", tok, ""); code != 200 {
				t.Errorf("serve does not answer: %d %s", code, body)
			}
			tree := processTree(s.cmd.Process.Pid)
			leaks := w.leaks(secrets...)
			if len(leaks) > 0 {
				t.Errorf("a secret on a command line:\n%s\nserve's process tree:\n%s", strings.Join(leaks, "\n"), strings.Join(tree, "\n"))
			}
			// The scan saw the processes serve started: its PostgreSQL.
			if !strings.Contains(strings.Join(tree, "\n"), "postgres") {
				t.Errorf("no PostgreSQL in serve's process tree:\n%s", strings.Join(tree, "\n"))
			}
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			<-s.done
		})
	}
}
