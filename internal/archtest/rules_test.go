package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/pgfork/pgfork/"

// repoRoot is the module's root directory (this package is internal/archtest).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// sourceFiles returns the module's non-test Go files, relative to root,
// leaving out the client modules (they are modules of their own).
func sourceFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == "clients" || strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "node_modules" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestErrorsClassifiedOnce: SQLSTATEs are compared only in dbclone's
// classifier (dbclone/sqlstate.go), and OS errors are never given a blanket
// kind: errs.Wrap(errs.Permission, …) of an arbitrary error turned a full disk
// or a missing file into "permission denied" (exit 8). Use errs.FromOS for OS
// errors and dbclone.SQLError (or its predicates) for server errors.
func TestErrorsClassifiedOnce(t *testing.T) {
	root := repoRoot(t)
	sqlstate := regexp.MustCompile(`\.Code\b|\.SQLState\(\)`)
	for _, rel := range sourceFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if rel != "dbclone/sqlstate.go" && sqlstate.MatchString(line) {
				t.Errorf("%s:%d compares a SQLSTATE; ask dbclone's classifier (SQLKind, SQLError, InUse, …): %s", rel, i+1, strings.TrimSpace(line))
			}
			if !strings.HasPrefix(rel, "internal/errs/") && strings.Contains(line, "errs.Wrap(errs.Permission") {
				t.Errorf("%s:%d gives an error a blanket permission kind; classify it (errs.FromOS, dbclone.SQLError): %s", rel, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// flagInText finds a command-line flag (--name) in a message.
var flagInText = regexp.MustCompile("(^|[\\s'\"(`])(--[a-z][a-z0-9-]+)")

// otherProgramsFlags are flags of programs other than pgfork that library
// messages may name: they tell what pgfork ran or what the user runs, and
// hold for every front end.
var otherProgramsFlags = map[string]string{
	"--version":     "PostgreSQL programs' version option (pgversion, pgbin, pgdata)",
	"--no-manifest": "pg_basebackup's (pgbackup/manifest.go)",
	"--privileged":  "a container runtime's (volume: loop devices)",
	"--device":      "a container runtime's (volume: loop devices)",
}

// flagRuleTODO lists directories whose messages still name pgfork's flags.
// TODO(issue 27): the restore split and the upgrade work fix these; empty
// this list when they are merged.
var flagRuleTODO = []string{}

// pgforkFlags returns the flags of pgfork's that s names.
func pgforkFlags(s string) []string {
	var found []string
	for _, m := range flagInText.FindAllStringSubmatch(s, -1) {
		if _, ok := otherProgramsFlags[m[2]]; !ok {
			found = append(found, m[2])
		}
	}
	return found
}

// TestLibraryMessagesNameNoFlags: library packages serve every front end (the
// CLI, HTTP clients of pgfork serve, Go callers), so their messages and hints
// never name a command-line flag; the CLI maps an option to its flag
// (errs.Error.WithCLI holds advice that names the command line).
func TestLibraryMessagesNameNoFlags(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	for _, rel := range sourceFiles(t, root) {
		if strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "bench/") || strings.HasPrefix(rel, "internal/archtest/") {
			continue
		}
		if slices.ContainsFunc(flagRuleTODO, func(dir string) bool { return strings.HasPrefix(rel, dir) }) {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		check := func(lit *ast.BasicLit) {
			s, err := strconv.Unquote(lit.Value)
			if err == nil && len(pgforkFlags(s)) > 0 {
				t.Errorf("%s: a library message names a command-line flag (%q); say what to change and let the CLI name the flag (WithCLI)", fset.Position(lit.Pos()), s)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			// A hint kept in a variable first (hint := "…") is a message too.
			if as, ok := n.(*ast.AssignStmt); ok {
				for i, l := range as.Lhs {
					if id, ok := l.(*ast.Ident); ok && strings.Contains(strings.ToLower(id.Name), "hint") && i < len(as.Rhs) {
						if lit, ok := as.Rhs[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							check(lit)
						}
					}
				}
				return true
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch sel.Sel.Name {
			case "New", "Wrap", "FromOS", "WithHint", "Errorf":
			default:
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "fmt" && sel.Sel.Name != "Errorf" || x.Name != "fmt" && x.Name != "errs" && sel.Sel.Name != "WithHint") {
				return true
			}
			for _, a := range call.Args {
				if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					check(lit)
				}
			}
			return true
		})
	}
}

// TestArchitectureDocDependencies: the "depends on" column of
// docs/ARCHITECTURE.md's package table lists exactly the module's packages
// each package imports (internal/ left out of the names; a word in
// parentheses after a name, like "clone (types)", is a note).
func TestArchitectureDocDependencies(t *testing.T) {
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `([a-z/]+)` \\|.*\\| ([^|]*) \\|$")
	documented := map[string][]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var deps []string
		col := regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(m[2], "")
		for _, d := range strings.Split(col, ",") {
			if d = strings.TrimSpace(d); d != "" && d != "—" && d != "-" {
				deps = append(deps, d)
			}
		}
		documented[m[1]] = deps
	}
	short := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "internal/") }
	for _, line := range packageImports(t) {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		if pkg == "bench" || pkg == "cmd/pgfork" || pkg == "internal/archtest" {
			continue // described in words ("everything", "the CLI binary; …")
		}
		want, ok := documented[short(pkg)]
		if !ok {
			want, ok = documented[pkg]
		}
		if !ok {
			t.Errorf("docs/ARCHITECTURE.md has no row for package %s", pkg)
			continue
		}
		var got []string
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module) {
				got = append(got, short(imp))
			}
		}
		sort.Strings(got)
		w := append([]string(nil), want...)
		sort.Strings(w)
		if strings.Join(got, ", ") != strings.Join(w, ", ") {
			t.Errorf("docs/ARCHITECTURE.md says %s depends on [%s]; it imports [%s]", pkg, strings.Join(w, ", "), strings.Join(got, ", "))
		}
	}
}
