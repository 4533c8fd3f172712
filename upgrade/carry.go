package upgrade

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
)

// The new cluster handed over to the application must answer where the old
// one did and let in only whom the old one let in: initdb's configuration
// (local trust, the build's default socket directory, often /tmp) must never
// serve. These are the old server's settings that decide it, read from the
// running server (its effective values: configuration files, ALTER SYSTEM
// and its command line, e.g. pg_ctl -o '-k DIR') or, for a stopped cluster,
// with postgres -C.

// whereSettings say where a server answers: always carried, whatever their
// source, as the two builds' defaults differ (Debian's socket directory is
// /var/run/postgresql, a source build's /tmp).
var whereSettings = []string{"port", "listen_addresses", "unix_socket_directories", "unix_socket_permissions", "unix_socket_group"}

// authSettings decide who gets in and how; carried where the old server
// does not run with the default.
var authSettings = []string{
	"password_encryption", "krb_server_keyfile", "krb_caseins_users", "authentication_timeout", "db_user_namespace",
	"ssl", "ssl_cert_file", "ssl_key_file", "ssl_ca_file", "ssl_crl_file", "ssl_crl_dir", "ssl_ciphers",
	"ssl_prefer_server_ciphers", "ssl_ecdh_curve", "ssl_min_protocol_version", "ssl_max_protocol_version",
	"ssl_dh_params_file", "ssl_passphrase_command", "ssl_passphrase_command_supports_reload",
}

// sslFiles are the settings that name files, relative to the data
// directory unless absolute.
var sslFiles = []string{"ssl_cert_file", "ssl_key_file", "ssl_ca_file", "ssl_crl_file", "ssl_crl_dir", "ssl_dh_params_file"}

// oldConfig is what the hand-over carries from the old cluster.
type oldConfig struct {
	// Settings are the old server's values of whereSettings (all) and
	// authSettings (those not at their default), by name.
	Settings map[string]string
	// HBAFile and IdentFile are where the old server read them.
	HBAFile, IdentFile string
	// Running: read from the running server (else with postgres -C).
	Running bool
}

// readOldConfig reads the old cluster's configuration: from the running
// server through psql run as the cluster's OS user (peer authentication, as
// the cluster's owner would connect), or with postgres -C when it is stopped.
func (u *upgrader) readOldConfig(ctx context.Context, running bool) (*oldConfig, error) {
	o := u.o
	c := &oldConfig{Settings: map[string]string{}, Running: running}
	names := append(append([]string{"hba_file", "ident_file"}, whereSettings...), authSettings...)
	if running {
		vals, err := u.showRunning(ctx, names)
		if err != nil {
			return nil, err
		}
		for n, v := range vals {
			c.Settings[n] = v
		}
	} else {
		for _, n := range names {
			cmd := o.User.Command(ctx, o.Old.Env, o.Old.tool("postgres"), "-D", o.OldDir, "-C", n)
			out, err := cmd.Output()
			if err != nil {
				continue // not a setting of this major
			}
			c.Settings[n] = strings.TrimRight(string(out), "\n")
		}
	}
	c.HBAFile, c.IdentFile = c.Settings["hba_file"], c.Settings["ident_file"]
	delete(c.Settings, "hba_file")
	delete(c.Settings, "ident_file")
	if c.HBAFile == "" || c.Settings["port"] == "" {
		return nil, errs.New(errs.Internal, "cannot read where the old cluster's pg_hba.conf is, or its port").WithPath(o.OldDir).
			WithHint("check that %s -D %s -C hba_file works as %s", o.Old.tool("postgres"), o.OldDir, u.userName())
	}
	return c, nil
}

// showRunning reads settings from the running old server: psql as the
// cluster's OS user on the socket its postmaster.pid names, as the role of
// that name (or --superuser). Only values not at their default are kept,
// except whereSettings and the configuration files.
func (u *upgrader) showRunning(ctx context.Context, names []string) (map[string]string, error) {
	o := u.o
	pf, err := instance.ReadPidFile(o.OldDir)
	if err != nil {
		return nil, errs.Wrap(errs.NotFound, err, "cannot read the old cluster's postmaster.pid").WithPath(o.OldDir).
			WithHint("is the old cluster running?")
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = quoteLiteral(n)
	}
	q := "SELECT name, setting, source FROM pg_settings WHERE name IN (" + strings.Join(quoted, ", ") + ")"
	roles := []string{u.userName()}
	if o.Superuser != "" {
		roles = []string{o.Superuser}
	}
	var last error
	for _, role := range roles {
		args := []string{"-X", "-q", "--csv", "-t", "-v", "ON_ERROR_STOP=1", "-h", pf.SocketDir, "-p", strconv.Itoa(pf.Port), "-U", role, "-d", "template1", "-c", q}
		cmd := o.User.Command(ctx, append(o.Old.Env, "PGCONNECT_TIMEOUT=30", "PGAPPNAME=pgfork upgrade"), o.Old.tool("psql"), args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			last = fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
			continue
		}
		rows, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
		if err != nil {
			return nil, errs.Wrap(errs.Internal, err, "cannot read the old server's settings")
		}
		vals := map[string]string{}
		for _, r := range rows {
			if len(r) != 3 {
				continue
			}
			if r[2] == "default" && !slices.Contains(whereSettings, r[0]) && r[0] != "hba_file" && r[0] != "ident_file" {
				continue
			}
			vals[r[0]] = r[1]
		}
		return vals, nil
	}
	return nil, errs.New(errs.Permission, "cannot read the running old cluster's settings (port, socket directories, authentication) to carry them to the new one: %v", last).
		WithPath(o.OldDir).
		WithHint("let %s connect to it through its socket (peer), or name the superuser; or upgrade without handing the new cluster over (it is then left stopped, for you to configure)", u.userName()).
		WithCLI("pass --superuser NAME, or --wait-analyze / --no-analyze")
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	if strings.Contains(s, `\`) {
		return "E'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", "''") + "'"
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// hbaTrustsLocal says whether pg_hba.conf content lets a local (Unix
// socket) connection in without authentication, or may (an include
// pgfork does not follow).
func hbaTrustsLocal(content string) bool {
	for _, line := range strings.Split(content, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "include") {
			return true
		}
		if f[0] == "local" && len(f) >= 4 && f[3] == "trust" {
			return true
		}
	}
	return false
}

// selfContained says whether a pg_hba.conf or pg_ident.conf can be copied
// into the new data directory as is: no include directive and no @file,
// which name files relative to its own directory.
func selfContained(content string) bool {
	for _, line := range strings.Split(content, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], "include") {
			return false
		}
		for _, w := range f {
			if strings.HasPrefix(w, "@") || strings.Contains(w, ",@") {
				return false
			}
		}
	}
	return true
}

// readAsUser reads a file with the rights of the cluster's OS user (cat run
// as that user): the path comes from the old server, which that user
// controls, so root must not open it with its own rights.
func (u *upgrader) readAsUser(ctx context.Context, path string) (string, error) {
	cmd := u.o.User.Command(ctx, nil, "cat", "--", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", errs.New(errs.Permission, "cannot read %s as %s: %s", path, u.userName(), strings.TrimSpace(stderr.String())).WithPath(path).
			WithHint("the new cluster needs the old one's authentication files")
	}
	return string(out), nil
}

// socketDirs lists the directories of a unix_socket_directories value.
func socketDirs(v, dataDir string) []string {
	var out []string
	for _, d := range strings.Split(v, ",") {
		d = strings.Trim(strings.TrimSpace(d), `"`)
		if d == "" {
			continue
		}
		if !filepath.IsAbs(d) && !strings.HasPrefix(d, "@") {
			d = filepath.Join(dataDir, d)
		}
		out = append(out, d)
	}
	return out
}

// openSockets returns the socket directories of c where another OS user
// than the cluster's could connect: the directory lets others through
// (or is an abstract socket) and unix_socket_permissions let others connect.
func (c *oldConfig) openSockets(dataDir string, uid int) []string {
	perm := int64(0o777)
	if v := c.Settings["unix_socket_permissions"]; v != "" {
		if p, err := strconv.ParseInt(v, 0, 32); err == nil {
			perm = p
		}
	}
	if perm&0o077 == 0 {
		return nil
	}
	var open []string
	for _, d := range socketDirs(c.Settings["unix_socket_directories"], dataDir) {
		fi, err := os.Stat(d)
		if err != nil || strings.HasPrefix(d, "@") || fi.Mode().Perm()&0o077 != 0 {
			open = append(open, d)
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid {
			open = append(open, d)
		}
	}
	return open
}

// checkTrust reads the old cluster's pg_hba.conf and refuses it when it
// lets local connections in without authentication (trust) on a socket
// directory other OS users can reach: pgfork never starts a server so. It
// returns the file's content.
func (u *upgrader) checkTrust(ctx context.Context, c *oldConfig) (string, error) {
	o := u.o
	hba, err := u.readAsUser(ctx, c.HBAFile)
	if err != nil {
		return "", err
	}
	uid := os.Getuid()
	if o.User != nil {
		uid = o.User.UID
	}
	if hbaTrustsLocal(hba) {
		if open := c.openSockets(o.OldDir, uid); len(open) > 0 {
			return "", errs.New(errs.Permission, "the old cluster's pg_hba.conf (%s) lets local connections in without a password (trust) and its socket directory %s is open to other users: pgfork does not start the new cluster that way",
				c.HBAFile, strings.Join(open, ", ")).WithPath(c.HBAFile).
				WithHint("use peer (or scram-sha-256) for local connections, or a socket directory only its user can enter (mode 0700), or unix_socket_permissions = 0700; or upgrade without handing the new cluster over").
				WithCLI("or pass --wait-analyze / --no-analyze")
		}
	}
	return hba, nil
}

// carry gives the new cluster (in o.NewDir, its private server reachable
// through conn) the old cluster's authentication files, port, socket
// directories, listen addresses and SSL settings (postgresql.auto.conf, by
// ALTER SYSTEM; the files copied, as the cluster's OS user). It refuses,
// naming what, when one cannot be carried or when the result would let
// local connections in without authentication on a socket other users can
// reach. It returns what it did, for the summary.
func (u *upgrader) carry(ctx context.Context, conn *pgx.Conn, c *oldConfig) ([]string, error) {
	o := u.o
	hba, err := u.checkTrust(ctx, c)
	if err != nil {
		return nil, err
	}
	var did []string
	set := map[string]string{}
	copyIn := func(src, name, what string, content string) error {
		if fsutil.Within(src, o.OldDir) && selfContained(content) {
			dst := filepath.Join(o.NewDir, name)
			if err := instance.WriteFileAs(dst, o.User, []byte(content)); err != nil {
				return err
			}
			did = append(did, fmt.Sprintf("%s copied from %s", name, src))
			return nil
		}
		// Outside the old data directory (e.g. /etc/postgresql/...), or
		// naming other files relative to it: used where it is.
		set[what] = src
		did = append(did, fmt.Sprintf("%s is %s, as for the old cluster", what, src))
		return nil
	}
	if err := copyIn(c.HBAFile, "pg_hba.conf", "hba_file", hba); err != nil {
		return nil, err
	}
	if c.IdentFile != "" {
		ident, err := u.readAsUser(ctx, c.IdentFile)
		if err != nil {
			return nil, err
		}
		if err := copyIn(c.IdentFile, "pg_ident.conf", "ident_file", ident); err != nil {
			return nil, err
		}
	}
	for n, v := range c.Settings {
		set[n] = v
	}
	// SSL files named relative to the old data directory are copied to the
	// same place in the new one (cp as the cluster's user keeps a key's mode).
	if ssl := c.Settings["ssl"]; ssl == "on" || ssl == "true" {
		for _, n := range sslFiles {
			v := c.Settings[n]
			if v == "" || filepath.IsAbs(v) {
				continue
			}
			if !filepath.IsLocal(v) {
				// Outside the old data directory: named where it is.
				set[n] = filepath.Join(o.OldDir, v)
				continue
			}
			cmd := o.User.Command(ctx, nil, "cp", "-pR", "--parents", "--", v, o.NewDir+"/")
			cmd.Dir = o.OldDir
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, errs.New(errs.Permission, "cannot copy the old cluster's %s (%s) into the new one: %s", n, v, strings.TrimSpace(string(out))).
					WithPath(filepath.Join(o.OldDir, v)).WithHint("make it readable by %s, or name it by an absolute path", u.userName())
			}
			did = append(did, fmt.Sprintf("%s %s copied", n, v))
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET "+pgx.Identifier{n}.Sanitize()+" = "+quoteLiteral(set[n])); err != nil {
			return nil, errs.Wrap(errs.Unsupported, err, "cannot carry the old cluster's setting %s = '%s' to PostgreSQL %d", n, set[n], o.New.Major).
				WithHint("set it in the old cluster to a value PostgreSQL %d accepts, or upgrade without handing the new cluster over", o.New.Major).
				WithCLI("or pass --wait-analyze / --no-analyze")
		}
	}
	where := "port " + set["port"]
	if s := set["unix_socket_directories"]; s != "" {
		where += ", socket directories " + s
	}
	if l := set["listen_addresses"]; l != "" {
		where += ", listen addresses " + l
	}
	did = append(did, "set in postgresql.auto.conf (ALTER SYSTEM): "+strings.Join(names, ", ")+" ("+where+")")
	return did, nil
}

// userName is the OS user the cluster runs as.
func (u *upgrader) userName() string {
	if n := u.o.User.NameOrEmpty(); n != "" {
		return n
	}
	if n := os.Getenv("USER"); n != "" {
		return n
	}
	return "postgres"
}
