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
