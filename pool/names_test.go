package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
)

// TestDatabaseNames: every hash IntegreSQL accepts gets a database name
// made of a-z, 0-9 and _, within 63 bytes, and different hashes never share
// one, including a literal hash equal to another's digest (the old
// "h"+sha256[:24] collision).
func TestDatabaseNames(t *testing.T) {
	long := strings.Repeat("ab", 40)
	sum := sha256.Sum256([]byte(long))
	oldDigest := "h" + hex.EncodeToString(sum[:])[:24]
	newDigest := "h_" + hex.EncodeToString(sum[:])[:24]
	sha512 := strings.Repeat("0123456789abcdef", 8)
	hashes := []string{
		"v1.2.3", "abc:def", "q83vEjRWeJA=", "a/b+c==", sha512, sha512[:127] + "e", long, oldDigest, newDigest,
		"abc", "ABC", "a-b", "a_b", "h_", "x", "0123456789abcdef0123456789abcdef", "été", "a b", `a"; DROP DATABASE postgres; --`,
		strings.Repeat("z", 1024),
	}
	safe := regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	for _, kind := range []struct{ kind, suffix string }{{"template", ""}, {"test", "_000"}, {"test", "_2147483647"}} {
		seen := map[string]string{}
		for _, h := range hashes {
			if !ValidHash(h) {
				t.Fatalf("hash %q is refused", h)
			}
			n := DatabaseName("abcdefghijklmnopqrst", kind.kind, h, kind.suffix)
			if !safe.MatchString(n) {
				t.Errorf("hash %q: name %q", h, n)
			}
			if o, ok := seen[n]; ok {
				t.Errorf("hashes %q and %q share the name %q", o, h, n)
			}
			seen[n] = h
		}
	}
	if n := DatabaseName("pgfork", "test", "0123456789abcdef0123456789abcdef", "_003"); n != "pgfork_test_0123456789abcdef0123456789abcdef_003" {
		t.Errorf("a plain hash is not kept as it is: %s", n)
	}
	for _, bad := range []string{"", "a\x00b", "a\nb", "\xff", strings.Repeat("z", 1025)} {
		if ValidHash(bad) {
			t.Errorf("hash %q accepted", bad)
		}
	}
}
