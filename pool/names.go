package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxHashLen bounds a template hash, in bytes.
const MaxHashLen = 1024

// ValidHash reports whether hash is an acceptable template hash: what
// IntegreSQL accepts (any non-empty string) restricted to printable UTF-8
// of at most MaxHashLen bytes. Hashes never reach SQL or paths as they
// are: DatabaseName encodes them.
func ValidHash(hash string) bool {
	if hash == "" || len(hash) > MaxHashLen || !utf8.ValidString(hash) {
		return false
	}
	for _, r := range hash {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// plainHash is what a hash must look like to appear verbatim in a database
// name.
var plainHash = regexp.MustCompile(`^[a-z0-9_]+$`)

// digestMark starts the encoded form of a hash; a hash that starts with it
// is never used verbatim, so an encoded hash can never equal a plain one.
const digestMark = "h_"

// digestLen is the number of hex digits of SHA-256 in an encoded hash (96
// bits): the longest name, a 20-byte prefix, "_test_", the encoded hash and
// a 10-digit id, fits PostgreSQL's 63 bytes.
const digestLen = 24

// DatabaseName returns prefix_kind_H followed by suffix (a test database's
// "_<id>"), where H is the hash itself when it is made of a-z, 0-9 and _,
// does not start with "h_" and the name fits in 63 bytes; otherwise H is
// "h_" and the first 96 bits of the hash's SHA-256 in hex. Different hashes
// thus never share a name (no truncation of one into another), and the
// name is always made of a-z, 0-9 and _.
func DatabaseName(prefix, kind, hash, suffix string) string {
	n := prefix + "_" + kind + "_" + hash + suffix
	if len(n) <= 63 && plainHash.MatchString(hash) && !strings.HasPrefix(hash, digestMark) {
		return n
	}
	sum := sha256.Sum256([]byte(hash))
	return prefix + "_" + kind + "_" + digestMark + hex.EncodeToString(sum[:])[:digestLen] + suffix
}

// prefixRe is what a database name prefix may look like.
var prefixRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,19}$`)

// ValidPrefix reports whether prefix may start database names: 1-20
// lower-case letters, digits or _, starting with a letter.
func ValidPrefix(prefix string) bool { return prefixRe.MatchString(prefix) }
