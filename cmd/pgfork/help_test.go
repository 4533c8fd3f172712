package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelpFitsWidth: every command's --help fits helpWidth columns (flag
// descriptions are wrapped; long examples are broken with a backslash).
func TestHelpFitsWidth(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		var b bytes.Buffer
		c.SetOut(&b)
		c.SetErr(&b)
		if err := c.Help(); err != nil {
			t.Fatalf("%s --help: %v", c.CommandPath(), err)
		}
		c.SetOut(nil)
		c.SetErr(nil)
		for _, line := range strings.Split(b.String(), "\n") {
			if n := len([]rune(line)); n > helpWidth {
				t.Errorf("%s --help has a line of %d columns (at most %d): %s", c.CommandPath(), n, helpWidth, line)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(streams{}))
}

// TestMissingArgsNamed: a command given too few arguments says which are
// missing, from its usage line, instead of cobra's "requires at least 2
// arg(s), only received 1".
func TestMissingArgsNamed(t *testing.T) {
	for _, c := range []struct {
		use  string
		n    int
		want string
	}{
		{"restore BACKUP... DST | restore CHAINDIR DST", 1, "DST"},
		{"restore BACKUP... DST | restore CHAINDIR DST", 0, "BACKUP... and DST"},
		{"copy SRC DST", 0, "SRC and DST"},
		{"clone SRC DST [flags]", 1, "DST"},
		{"upgrade OLD NEW", 2, ""},
		{"ls", 0, ""},
		{"snapshot DB [NAME]", 0, "DB"},
	} {
		if got := missingArgs(c.use, c.n); got != c.want {
			t.Errorf("missingArgs(%q, %d) = %q, want %q", c.use, c.n, got, c.want)
		}
	}
	restore, _, err := newRootCmd(streams{}).Find([]string{"restore"})
	if err != nil {
		t.Fatal(err)
	}
	err = restore.Args(restore, []string{"/backups/full"})
	if exitCode(err) != exitUsage || !strings.Contains(err.Error(), "missing DST") {
		t.Errorf("pgfork restore DIR: %v (exit %d); want exit %d naming the missing DST", err, exitCode(err), exitUsage)
	}
}
