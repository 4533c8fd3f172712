package pgdata

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
)

// TestForeignOverrides (issue 57, rule 4): what a configuration written by
// someone else becomes. Libraries keep plain names only, commands are
// emptied wherever they are set (postgresql.conf, an include, conf.d,
// postgresql.auto.conf), files outside the data directory get their
// defaults (ssl off with them); includes leaving the data directory,
// symlinked configuration files and data_directory are refused.
func TestForeignOverrides(t *testing.T) {
	always := map[string]string{"shared_preload_libraries": "", "session_preload_libraries": "", "local_preload_libraries": "",
		"dynamic_library_path": "$libdir", "jit_provider": "llvmjit", "archive_command": "", "restore_command": "",
		"archive_cleanup_command": "", "recovery_end_command": "", "ssl_passphrase_command": "", "external_pid_file": ""}
	with := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range always {
			out[k] = v
		}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	cases := []struct {
		name    string
		files   map[string]string
		want    map[string]string
		refused string
	}{
		{"defaults", map[string]string{"postgresql.conf": "work_mem = '4MB'\n"}, always, ""},
		{"libraries", map[string]string{"postgresql.conf": "shared_preload_libraries = 'pg_stat_statements, \"/tmp/evil.so\", $libdir/auto_explain, ../x, $libdir/../../tmp/y'\n" +
			"jit_provider = '../../../tmp/evil'\n", "postgresql.auto.conf": "session_preload_libraries = '/tmp/e'\noauth_validator_libraries = '/tmp/o'\nextension_control_path = '/tmp:$system'\n"},
			with(map[string]string{"shared_preload_libraries": "pg_stat_statements, $libdir/auto_explain", "oauth_validator_libraries": "", "extension_control_path": "$system"}), ""},
		{"commands everywhere", map[string]string{"postgresql.conf": "include 'extra.conf'\ninclude_dir 'conf.d'\narchive_library = 'evil'\n",
			"extra.conf": "archive_cleanup_command = 'id > /tmp/x'\n", "conf.d/a.conf": "recovery_end_command = 'id'\n",
			"postgresql.auto.conf": "restore_command = 'cp x'\n"}, with(map[string]string{"archive_library": ""}), ""},
		{"files outside", map[string]string{"postgresql.conf": "ssl = on\nssl_key_file = '/etc/ssl/private/key.pem'\nssl_cert_file = 'server.crt'\n" +
			"hba_file = '/etc/postgresql/15/main/pg_hba.conf'\nlog_directory = '../../var/lib/postgresql/15/main'\nlog_filename = '../x'\n"},
			with(map[string]string{"ssl": "off", "ssl_key_file": "server.key", "hba_file": "pg_hba.conf", "log_directory": "log",
				"log_filename": "postgresql-%Y-%m-%d_%H%M%S.log"}), ""},
		{"include outside", map[string]string{"postgresql.conf": "include '/etc/passwd'\n"}, nil, "outside the data directory"},
		{"include_dir outside", map[string]string{"postgresql.auto.conf": "include_dir '../conf'\n"}, nil, "outside the data directory"},
		{"data_directory", map[string]string{"postgresql.conf": "data_directory = '/var/lib/postgresql/15/main'\n"}, nil, "data_directory"},
		{"symlinked postgresql.conf", map[string]string{"postgresql.conf": "->/etc/hostname"}, nil, "symlink"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := testenv.Dir(t)
			for name, text := range c.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				if target, ok := strings.CutPrefix(text, "->"); ok {
					if err := os.Symlink(target, p); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ForeignOverrides(dir)
			if c.refused != "" {
				if errs.KindOf(err) != errs.Unsupported || !strings.Contains(err.Error(), c.refused) {
					t.Fatalf("got %v, %v; want a refusal saying %q", got, err, c.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ForeignConf(got) != ForeignConf(c.want) {
				t.Errorf("overrides:\n%s\nwant:\n%s", ForeignConf(got), ForeignConf(c.want))
			}
		})
	}
}

// TestOpenLinkedDir (issue 57, rule 4, G11): a link of a data directory is
// followed only to a directory of the data directory's owner that no one
// else can write, on a path no one else can write.
func TestOpenLinkedDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the check is of root copying another user's links")
	}
	base := testenv.Dir(t)
	mk := func(name string, mode os.FileMode, uid int) string {
		t.Helper()
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	data := mk("data", 0o700, 65534)
	own := mk("own", 0o700, 65534)
	rootOnly := mk("root-only", 0o700, 0)
	open := mk("open", 0o777, 0)
	inOpen := filepath.Join(open, "ts")
	if err := os.Mkdir(inOpen, 0o700); err != nil {
		t.Fatal(err)
	}
	_ = os.Chown(inOpen, 65534, 65534)
	sticky := mk("sticky", 0o777, 0)
	if err := syscall.Chmod(sticky, 0o1777); err != nil {
		t.Fatal(err)
	}
	inSticky := filepath.Join(sticky, "ts")
	if err := os.Mkdir(inSticky, 0o700); err != nil {
		t.Fatal(err)
	}
	_ = os.Chown(inSticky, 65534, 65534)
	groupW := mk("group-writable", 0o770, 65534)
	viaLink := filepath.Join(base, "via-link")
	if err := os.Symlink(own, viaLink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		target string
		ok     bool
	}{{own, true}, {inSticky, true}, {viaLink, true}, {rootOnly, false}, {inOpen, false}, {groupW, false}} {
		f, err := OpenLinkedDir(data, "pg_tblspc/1", c.target)
		if c.ok != (err == nil) {
			t.Errorf("%s: %v, want ok=%v", c.target, err, c.ok)
		}
		if err == nil {
			f.Close()
		} else if errs.KindOf(err) != errs.Permission || !strings.Contains(err.Error(), "pg_tblspc/1") {
			t.Errorf("%s: %v, want a permission error naming the link", c.target, err)
		}
	}
}
