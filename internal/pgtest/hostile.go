package pgtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgfork/pgfork/instance"
)

// Nobody is the other local user of attack tests (uid 65534).
var Nobody = &instance.OSUser{Name: "nobody", UID: 65534, GID: 65534}

// Hostile is a stopped cluster that another local user (Nobody) made to
// have root run its code or copy root's files (issue 57, rule 4).
type Hostile struct {
	// Data is the cluster's data directory, in a directory Nobody owns.
	Data string
	// Link is its pg_tblspc/16400, a link to a root-only directory that
	// holds a file with Secret in it.
	Link, Secret string
	// Marks is where its code leaves a file when it runs: "library" (the
	// constructor of its preload library, with the uid it ran as) or the
	// name of the command setting that ran.
	Marks string
	// Settings are the command and library settings it sets.
	Settings []string
}

// NewHostile makes a Hostile cluster in base with the build in binDir (env
// its environment): initdb run as Nobody, then, as Nobody,
// shared_preload_libraries, session_preload_libraries and
// local_preload_libraries naming a library built here with cc (a
// constructor writing a mark: no magic block needed), dynamic_library_path
// leading to it, and archive_command, archive_cleanup_command,
// recovery_end_command, restore_command and ssl_passphrase_command writing
// marks, spread over postgresql.conf, a conf.d file and
// postgresql.auto.conf (where ALTER SYSTEM on a primary puts them, and
// pg_basebackup then copies them into a standby). It needs root and cc
// (skips without cc).
func NewHostile(t testing.TB, base, binDir string, env []string) Hostile {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the attack is on root")
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("needs cc to build the hostile library")
	}
	ctx := context.Background()
	h := Hostile{Marks: filepath.Join(base, "marks"), Secret: "root's secret " + filepath.Base(base)}
	if err := os.Mkdir(h.Marks, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(h.Marks, 0o1777); err != nil {
		t.Fatal(err)
	}
	lib, c := filepath.Join(base, "evil.so"), filepath.Join(base, "evil.c")
	code := "#include <stdio.h>\n#include <unistd.h>\n" +
		"__attribute__((constructor)) static void evil(void) {\n" +
		"\tFILE *f = fopen(\"" + filepath.Join(h.Marks, "library") + "\", \"w\");\n" +
		"\tif (f) { fprintf(f, \"uid %d\\n\", (int)getuid()); fclose(f); }\n}\n"
	if err := os.WriteFile(c, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cc", "-shared", "-fPIC", "-o", lib, c).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	_ = os.Chmod(lib, 0o755)

	home := filepath.Join(base, "nobody")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, Nobody.UID, Nobody.GID); err != nil {
		t.Fatal(err)
	}
	h.Data = filepath.Join(home, "src")
	if err := instance.InitDB(ctx, instance.InitOptions{BinDir: binDir, Env: env, DataDir: h.Data, User: Nobody, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	mark := func(name string) string {
		h.Settings = append(h.Settings, name)
		return name + " = 'touch " + filepath.Join(h.Marks, name) + "'\n"
	}
	libs := func(name string) string {
		h.Settings = append(h.Settings, name)
		return name + " = '" + lib + "'\n"
	}
	script := "mkdir " + h.Data + "/conf.d && cat >> " + h.Data + "/postgresql.conf <<'EOF'\n" +
		libs("shared_preload_libraries") + mark("archive_command") + "include_dir = 'conf.d'\nEOF\n" +
		"cat > " + h.Data + "/conf.d/standby.conf <<'EOF'\n" +
		mark("archive_cleanup_command") + mark("recovery_end_command") + libs("session_preload_libraries") + "EOF\n" +
		"cat >> " + h.Data + "/postgresql.auto.conf <<'EOF'\n" +
		mark("restore_command") + mark("ssl_passphrase_command") + libs("local_preload_libraries") +
		"dynamic_library_path = '" + base + ":$libdir'\nEOF\n"
	cmd := Nobody.Command(ctx, nil, "/bin/sh", "-c", script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}

	secretDir := filepath.Join(base, "root-only")
	if err := os.Mkdir(secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secretDir, "secret"), []byte(h.Secret), 0o600); err != nil {
		t.Fatal(err)
	}
	h.Link = filepath.Join(h.Data, "pg_tblspc", "16400")
	if err := os.Symlink(secretDir, h.Link); err != nil {
		t.Fatal(err)
	}
	return h
}

// CheckNothingRan fails t for every mark the cluster's code left.
func (h Hostile) CheckNothingRan(t testing.TB) {
	t.Helper()
	ents, _ := os.ReadDir(h.Marks)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(h.Marks, e.Name()))
		t.Errorf("the hostile cluster's code ran: %s (%s)", e.Name(), strings.TrimSpace(string(b)))
	}
}

// CheckSecretNotIn fails t for every file below dir holding the secret.
func (h Hostile) CheckSecretNotIn(t testing.TB, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), h.Secret) {
				t.Errorf("root's secret was copied to %s", p)
			}
		}
		return nil
	})
}
