package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestResolveVolume: a base with a volume record resolves to the state
// directory on the volume, and Ensure refuses to create it while the
// volume is detached (nothing written under the empty mount point).
func TestResolveVolume(t *testing.T) {
	base := t.TempDir()
	if got := Resolve(base); got != base {
		t.Fatalf("Resolve without a record = %s, want %s", got, base)
	}
	if err := os.WriteFile(filepath.Join(base, VolumeRecord), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(base, VolumeMount, VolumeState)
	if got := Resolve(base); got != want {
		t.Fatalf("Resolve with a record = %s, want %s", got, want)
	}
	if err := os.Mkdir(filepath.Join(base, VolumeMount), 0o755); err != nil {
		t.Fatal(err)
	}
	err := Layout{Root: want}.Ensure()
	if !errors.Is(err, ErrVolumeDetached) {
		t.Fatalf("Ensure on a detached volume: %v, want ErrVolumeDetached", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(base, VolumeMount)); len(ents) != 0 {
		t.Errorf("Ensure wrote under the empty mount point: %v", ents)
	}
	if err := os.Mkdir(want, 0o755); err != nil { // the volume, attached
		t.Fatal(err)
	}
	if err := (Layout{Root: want}).Ensure(); err != nil {
		t.Fatalf("Ensure on an attached volume: %v", err)
	}
	if _, err := os.Stat(filepath.Join(want, "templates")); err != nil {
		t.Error(err)
	}
}
