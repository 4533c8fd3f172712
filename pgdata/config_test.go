package pgdata

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseConfLine(t *testing.T) {
	for _, c := range []struct {
		line, name, value string
		ok                bool
	}{
		{"data_directory = '/var/lib/postgresql/15/main'\t\t# use data in another directory", "data_directory", "/var/lib/postgresql/15/main", true},
		{"  Hba_File='/etc/a b/pg_hba.conf'", "hba_file", "/etc/a b/pg_hba.conf", true},
		{"port 5433 # comment", "port", "5433", true},
		{"include_dir 'conf.d'", "include_dir", "conf.d", true},
		{"x = 'it''s \\'q\\''", "x", "it's 'q'", true},
		{"#data_directory = '/x'", "", "", false},
		{"   ", "", "", false},
		{"my.custom = on", "my.custom", "on", true},
	} {
		n, v, ok := parseConfLine(c.line)
		if n != c.name || v != c.value || ok != c.ok {
			t.Errorf("parseConfLine(%q) = %q, %q, %v; want %q, %q, %v", c.line, n, v, ok, c.name, c.value, c.ok)
		}
	}
}

func TestDebianConfigDir(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "var/lib/postgresql/15/main")
	conf := filepath.Join(root, "etc/postgresql/15/main")
	for _, d := range []string{data, conf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got := debianConfigDir(root, data); got != "" {
		t.Errorf("without postgresql.conf: %q, want \"\"", got)
	}
	if err := os.WriteFile(filepath.Join(conf, "postgresql.conf"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := debianConfigDir(root, data); got != conf {
		t.Errorf("debianConfigDir = %q, want %q", got, conf)
	}
	for _, d := range []string{filepath.Join(root, "var/lib/postgresql/15"), filepath.Join(root, "var/lib/postgresql/15/main/base"), filepath.Join(root, "srv/15/main")} {
		if got := debianConfigDir(root, d); got != "" {
			t.Errorf("debianConfigDir(%s) = %q, want \"\"", d, got)
		}
	}
}

// TestCopyConfig checks the rewriting rules on files: settings naming the
// source's files commented out in every file, includes inside the
// configuration directory copied (an absolute one made relative), one
// outside kept with a warning, and a symlink the data copy put in the clone
// replaced, not written through.
func TestCopyConfig(t *testing.T) {
	base := t.TempDir()
	conf, dst, shared := filepath.Join(base, "etc"), filepath.Join(base, "clone"), filepath.Join(base, "shared.conf")
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(conf, "postgresql.conf"), "data_directory = '/src'\nexternal_pid_file = '/run/x.pid'\ninclude_dir = 'conf.d'\n"+
		"include '"+filepath.Join(conf, "abs.conf")+"'\ninclude_if_exists 'missing.conf'\ninclude '"+shared+"'\nwork_mem = '5MB'\n")
	write(filepath.Join(conf, "conf.d/a.conf"), "stats_temp_directory = '/run/stats'\nshared_buffers = '1GB'\n")
	write(filepath.Join(conf, "conf.d/.hidden.conf"), "bad = 1\n")
	write(filepath.Join(conf, "abs.conf"), "HBA_FILE = '/etc/elsewhere'\n")
	write(filepath.Join(conf, "hba"), "local all all peer\n")
	write(shared, "max_connections = 50\n")
	victim := filepath.Join(base, "victim")
	write(victim, "source's file\n")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dst, "pg_hba.conf")); err != nil {
		t.Fatal(err)
	}

	cc, err := CopyConfig(ConfigFiles{ConfigFile: filepath.Join(conf, "postgresql.conf"), HBAFile: filepath.Join(conf, "hba"),
		IdentFile: filepath.Join(conf, "pg_ident.conf")}, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(cc.Files)
	if want := []string{"abs.conf", "conf.d/a.conf", "pg_hba.conf", "postgresql.conf"}; !slices.Equal(cc.Files, want) {
		t.Errorf("Files = %v, want %v", cc.Files, want)
	}
	if len(cc.CommentedOut) != 4 {
		t.Errorf("CommentedOut = %v, want data_directory, external_pid_file, stats_temp_directory, hba_file", cc.CommentedOut)
	}
	if len(cc.Warnings) != 2 || !strings.Contains(strings.Join(cc.Warnings, "\n"), shared) {
		t.Errorf("Warnings = %q, want the outside include and the missing pg_ident.conf", cc.Warnings)
	}
	settings, err := ReadConfigSettings(filepath.Join(dst, "postgresql.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"data_directory", "external_pid_file", "stats_temp_directory", "hba_file", "bad"} {
		if v, ok := settings[n]; ok {
			t.Errorf("the clone's configuration still sets %s = %q", n, v)
		}
	}
	if settings["work_mem"] != "5MB" || settings["shared_buffers"] != "1GB" || settings["max_connections"] != "50" {
		t.Errorf("the clone's configuration lost settings: %v", settings)
	}
	main, _ := os.ReadFile(filepath.Join(dst, "postgresql.conf"))
	if !strings.Contains(string(main), "include = 'abs.conf'") || !strings.Contains(string(main), "# pgfork clone: commented out, it names the source's data directory\n#data_directory = '/src'\n") {
		t.Errorf("the clone's postgresql.conf:\n%s", main)
	}
	if b, _ := os.ReadFile(victim); string(b) != "source's file\n" {
		t.Errorf("CopyConfig wrote through a symlink into %s: %q", victim, b)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "pg_hba.conf")); string(b) != "local all all peer\n" {
		t.Errorf("the clone's pg_hba.conf = %q", b)
	}
}
