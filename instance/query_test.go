package instance

import (
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestEncodeQuerySpaces (issue 19, F15): a socket directory with a space
// and one with a plus reach pgx as they are.
func TestEncodeQuerySpaces(t *testing.T) {
	for _, dir := range []string{"/run/my pg", "/run/a+b", "/run/plain"} {
		c, err := pgx.ParseConfig("postgres:///postgres?" + EncodeQuery(url.Values{"host": {dir}, "port": {"5432"}}))
		if err != nil || c.Host != dir {
			t.Errorf("%q came back as %q (%v)", dir, c.Host, err)
		}
	}
}
