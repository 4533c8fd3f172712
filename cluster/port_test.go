package cluster

import (
	"strings"
	"testing"

	"github.com/pgfork/pgfork/internal/errs"
)

// TestParsePort: the one place clone --start and restore --start choose a
// branch's port: "" is the default (0), "auto" a free port of 127.0.0.1,
// else 1-65535; anything else is a usage error whose advice names no flag
// outside the CLI's part.
func TestParsePort(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{{"", 0}, {"5433", 5433}, {"1", 1}, {"65535", 65535}} {
		if got, err := ParsePort(c.in); err != nil || got != c.want {
			t.Errorf("ParsePort(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	p, err := ParsePort(PortAuto)
	if err != nil || p < 1 || p > 65535 {
		t.Errorf("ParsePort(auto) = %d, %v; want a free port", p, err)
	}
	for _, bad := range []string{"0", "65536", "-1", "x", "5432 "} {
		_, err := ParsePort(bad)
		if errs.KindOf(err) != errs.Usage || strings.Contains(errs.HintOf(err), "--") || !strings.Contains(errs.CLIHintOf(err), "--port") {
			t.Errorf("ParsePort(%q): %v (hint %q, CLI %q); want a usage error", bad, err, errs.HintOf(err), errs.CLIHintOf(err))
		}
	}
}
