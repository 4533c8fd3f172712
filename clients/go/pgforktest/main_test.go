package pgforktest_test

import (
	"os"
	"testing"

	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// TestMain starts a pgfork serve for this package when none is configured
// and `pgfork` is on PATH (clients/test.sh configures one).
func TestMain(m *testing.M) { os.Exit(pgforktest.Main(m)) }
