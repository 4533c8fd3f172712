package template

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/pgfork/pgfork/instance"
	"github.com/pgfork/pgfork/internal/testenv"
	"github.com/pgfork/pgfork/pgbin"
)

func TestResolveSetupOrder(t *testing.T) {
	d := testenv.Dir(t)
	mig := filepath.Join(d, "mig")
	if err := os.Mkdir(mig, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"002_b.up.sql", "001_a.up.sql", "001_a.down.sql", "notes.txt", "010_c.up.sql"} {
		if err := os.WriteFile(filepath.Join(mig, n), []byte("-- "+n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	extra := filepath.Join(d, "seed.sql")
	if err := os.WriteFile(extra, []byte("select 1;"), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := ResolveSetup([]string{mig, extra})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	want := []string{"mig/001_a.up.sql", "mig/002_b.up.sql", "mig/010_c.up.sql", "seed.sql"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("setup order %v, want %v", names, want)
	}
}

func TestKeyCoversWhatShapesTheTemplate(t *testing.T) {
	base := Options{PG: pgbin.Installation{BinDir: "/x", Version: "15.18"}}
	files := []SetupFile{{Name: "a.sql", Data: []byte("create table a();")}}
	k := Key(base, files)
	if len(k) != KeyLen || Key(base, files) != k {
		t.Fatalf("key %q not stable or wrong length", k)
	}
	if other := (Options{PG: pgbin.Installation{BinDir: "/elsewhere", Version: "15.18"}}); Key(other, files) != k {
		t.Error("key depends on the bin directory, not only the version")
	}
	variants := map[string]string{}
	add := func(what string, o Options, f []SetupFile) {
		kk := Key(o, f)
		if kk == k {
			t.Errorf("%s does not change the key", what)
		}
		if prev, ok := variants[kk]; ok {
			t.Errorf("%s and %s give the same key", what, prev)
		}
		variants[kk] = what
	}
	v := base
	v.PG.Version = "15.19"
	add("version", v, files)
	v = base
	v.Init = instance.InitOptions{Locale: "en_US.UTF-8"}
	add("locale", v, files)
	v = base
	v.Init = instance.InitOptions{Encoding: "LATIN1"}
	add("encoding", v, files)
	v = base
	v.SetupCmd = "migrate up"
	add("command", v, files)
	add("content", base, []SetupFile{{Name: "a.sql", Data: []byte("create table b();")}})
	add("name", base, []SetupFile{{Name: "b.sql", Data: []byte("create table a();")}})
	add("no setup", base, nil)
	add("order", base, []SetupFile{files[0], {Name: "z.sql"}})
	add("order2", base, []SetupFile{{Name: "z.sql"}, files[0]})
}
