package client

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// TemplateHash returns the template hash for the files under dir and extraKey:
// 32 hex digits of a SHA-256 over every regular file's path (relative, with
// forward slashes) and content, in path order, then extraKey. Files and
// directories whose names start with "." are left out. Either argument may be
// empty. Change extraKey (e.g. to a version of your migration code) to build
// a new template when the files did not change. pgfork's Python client
// computes the same hash for the same input.
//
// dir may be a symlink to a directory (it is resolved first). Below it,
// symlinks to files are hashed with their target's content, symlinks to
// directories are not followed, and dangling symlinks are left out.
func TemplateHash(dir, extraKey string) (string, error) {
	if dir == "" {
		return TemplateHashFS(nil, extraKey)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("template hash: %w", err)
	}
	if !info.IsDir() {
		return "", fmt.Errorf("template hash: %s is not a directory", dir)
	}
	// WalkDir does not enter a symlinked root: resolve it first.
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("template hash: %w", err)
	}
	return TemplateHashFS(os.DirFS(root), extraKey)
}

// TemplateHashFS is TemplateHash over the files of fsys (for example an
// embed.FS, or fs.Sub of one for its migrations folder); a nil fsys has no
// files. For os.DirFS(dir) it equals TemplateHash(dir, extraKey).
func TemplateHashFS(fsys fs.FS, extraKey string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "pgfork-template-hash/1\n")
	if fsys != nil {
		files, err := listFiles(fsys)
		if err != nil {
			return "", err
		}
		for _, rel := range files {
			data, err := fs.ReadFile(fsys, rel)
			if err != nil {
				return "", fmt.Errorf("template hash: %w", err)
			}
			fmt.Fprintf(h, "file %s\n%d\n", rel, len(data))
			h.Write(data)
			h.Write([]byte("\n"))
		}
	}
	fmt.Fprintf(h, "extra %d\n%s", len(extraKey), extraKey)
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// listFiles returns the regular files of fsys (following symlinks to files,
// not to directories, leaving dangling ones out), slash-separated, sorted,
// skipping dot names.
func listFiles(fsys fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		fi, err := fs.Stat(fsys, p) // follows symlinks (os.DirFS)
		if errors.Is(err, fs.ErrNotExist) && d.Type()&fs.ModeSymlink != 0 {
			return nil // dangling symlink: no file to hash
		}
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("template hash: %w", err)
	}
	sort.Strings(files)
	return files, nil
}
