package client

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// vectorsFile is the one file of template-hash test vectors that every
// pgfork client (Go, Python, JS/TS, Rust) tests against.
const vectorsFile = "../../testdata/template-hash-vectors.json"

type hashVector struct {
	Name     string            `json:"name"`
	ExtraKey string            `json:"extra_key"`
	NoDir    bool              `json:"no_dir"`
	Files    map[string]string `json:"files"`
	Outside  map[string]string `json:"outside"`
	Symlinks []struct {
		Path   string `json:"path"`
		Target string `json:"target"`
	} `json:"symlinks"`
	Hash string `json:"hash"`
}

// TestTemplateHashSharedVectors: TemplateHash reproduces every case of the
// shared vectors file byte for byte, so all clients share templates.
func TestTemplateHashSharedVectors(t *testing.T) {
	raw, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []hashVector `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", vectorsFile, err)
	}
	if len(doc.Cases) == 0 {
		t.Fatalf("%s has no cases", vectorsFile)
	}
	for _, c := range doc.Cases {
		t.Run(c.Name, func(t *testing.T) {
			base := t.TempDir()
			write := func(p, data string) {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tree := filepath.Join(base, "tree")
			if err := os.MkdirAll(tree, 0o755); err != nil {
				t.Fatal(err)
			}
			for rel, data := range c.Files {
				write(filepath.Join(tree, filepath.FromSlash(rel)), data)
			}
			for rel, data := range c.Outside {
				write(filepath.Join(base, filepath.FromSlash(rel)), data)
			}
			for _, s := range c.Symlinks {
				if err := os.Symlink(filepath.FromSlash(s.Target), filepath.Join(tree, filepath.FromSlash(s.Path))); err != nil {
					t.Fatal(err)
				}
			}
			dir := tree
			if c.NoDir {
				dir = ""
			}
			got, err := TemplateHash(dir, c.ExtraKey)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.Hash {
				t.Errorf("TemplateHash = %s, the shared vector says %s", got, c.Hash)
			}
		})
	}
}
