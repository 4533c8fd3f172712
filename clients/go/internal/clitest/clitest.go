// Package clitest finds a migration tool's command line for the tests of the
// CLI-based migrator adapters: on PATH, else `go run MODULE@VERSION` from the
// Go module proxy; when neither works the test is skipped with a message
// that starts with "KNOWN SKIP" (clients/test.sh lets only those through).
package clitest

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Command returns the command that runs tool: tool itself if it is on PATH,
// else go run pkg@version if that builds and answers versionArgs. Otherwise it
// skips t, saying why.
func Command(t *testing.T, tool, pkg, version string, versionArgs ...string) []string {
	t.Helper()
	if p, err := exec.LookPath(tool); err == nil {
		return []string{p}
	}
	cmd := []string{"go", "run", pkg + "@" + version}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, cmd[0], append(cmd[1:], versionArgs...)...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 600 { // the reason is at the end
			msg = "…" + msg[len(msg)-600:]
		}
		t.Skipf("KNOWN SKIP (%s CLI unavailable): %s is not on PATH and `%s` failed (%v): %s",
			tool, tool, strings.Join(append(cmd, versionArgs...), " "), err, msg)
	}
	return cmd
}
