// Package secret keeps the random passwords pgfork hands out (the client
// role of `pgfork serve`'s managed cluster and of its cluster isolation)
// in files of their own, 0600, created on first use.
package secret

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/fsutil"
)

// Password reads the password kept in path, creating a random one (32 hex
// digits) on first use or when the file holds fewer than 16 characters.
func Password(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) >= 16 {
		return strings.TrimSpace(string(b)), nil
	}
	buf := make([]byte, 16)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	pw := hex.EncodeToString(buf)
	if err := fsutil.WriteFileAtomic(path, []byte(pw+"\n"), 0o600); err != nil {
		return "", errs.FromOS(err, "", "cannot write %s", path)
	}
	return pw, nil
}
