package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfork/pgfork/instance"
)

// DebianCluster is a cluster laid out as Debian's packaging does: the data
// directory holds no configuration; postgresql.conf, pg_hba.conf,
// pg_ident.conf and conf.d live in a configuration directory, and
// postgresql.conf names the data directory, the authentication files, an
// external pid file and the socket directory.
type DebianCluster struct {
	// Data is the data directory, Conf the configuration directory, Run
	// the socket directory (short, as /var/run/postgresql), PidFile the
	// external pid file.
	Data, Conf, Run, PidFile string
	// Port is the cluster's port (a free TCP port of 127.0.0.1).
	Port int
}

// NewDebianCluster runs initdb in base/lib-main and lays the cluster out
// as Debian's pg_createcluster does, its configuration in base/etc-main.
// It is not started.
func (b Build) NewDebianCluster(t *testing.T, base string) DebianCluster {
	t.Helper()
	// The socket directory is short (as Debian's /var/run/postgresql): a
	// socket path has at most 107 bytes, and base may be long.
	run, err := os.MkdirTemp("", "pgrun-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(run) })
	if err := os.Chmod(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := b.User.Chown(run); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(base, "lib-main")
	InitDB(t, data, b.Server())
	c := DebianCluster{Data: data, Conf: filepath.Join(base, "etc-main"), Run: run}
	c.PidFile = filepath.Join(c.Run, "main.pid")
	port, err := instance.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c.Port = port
	for _, d := range []string{c.Conf, filepath.Join(c.Conf, "conf.d")} {
		if err := b.User.MkdirOwned(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"postgresql.conf", "pg_hba.conf", "pg_ident.conf"} {
		if err := os.Rename(filepath.Join(c.Data, f), filepath.Join(c.Conf, f)); err != nil {
			t.Fatal(err)
		}
	}
	add := func(name, text string) {
		f, err := os.OpenFile(filepath.Join(c.Conf, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(text); err != nil {
			t.Fatal(err)
		}
	}
	add("postgresql.conf", fmt.Sprintf(`
# as Debian's pg_createcluster writes it
data_directory = '%s'		# use data in another directory
hba_file = '%s/pg_hba.conf'	# host-based authentication file
ident_file = '%s/pg_ident.conf'	# ident configuration file
external_pid_file = '%s'	# write an extra PID file
port = %d
unix_socket_directories = '%s'
listen_addresses = ''
fsync = off
include_dir = 'conf.d'
`, c.Data, c.Conf, c.Conf, c.PidFile, c.Port, c.Run))
	// conf.d: a setting of the user's that the clone keeps, and archiving
	// that the clone's reset must override even from an include.
	add("conf.d/custom.conf", "work_mem = '7MB'\narchive_mode = on\narchive_command = '/bin/true'\n"+
		"restore_command = '/bin/false'\nprimary_conninfo = 'host=/nonexistent'\nprimary_slot_name = 'nosuchslot'\n")
	add("pg_hba.conf", "# debian fixture hba\n")
	if err := b.User.Chown(c.Conf); err != nil {
		t.Fatal(err)
	}
	return c
}
