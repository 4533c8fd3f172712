package pgforktest_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeInSync checks that every Go block of ../README.md that declares
// a test function appears verbatim in example_test.go, where it is compiled
// and run.
func TestReadmeInSync(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	examples, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	checked := 0
	for _, b := range blocks {
		if !strings.HasPrefix(b[1], "func Test") {
			continue
		}
		checked++
		if !strings.Contains(string(examples), b[1]) {
			t.Errorf("README block is not in example_test.go (update one of them):\n%s", b[1])
		}
	}
	if checked < 2 {
		t.Errorf("found %d test blocks in README.md, want at least 2", checked)
	}
}

// TestReadmeGoGet checks that the README's `go get` names this module's path
// (from go.mod), so the command resolves.
func TestReadmeGoGet(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^module (\S+)$`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("no module line in go.mod")
	}
	gets := regexp.MustCompile(`(?m)^go get (\S+)@\S+$`).FindAllSubmatch(readme, -1)
	if len(gets) == 0 {
		t.Fatal("README.md shows no `go get MODULE@VERSION` line")
	}
	for _, g := range gets {
		if string(g[1]) != string(m[1]) {
			t.Errorf("README.md: go get %s, but go.mod's module is %s", g[1], m[1])
		}
	}
}
