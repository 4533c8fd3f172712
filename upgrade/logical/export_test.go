package logical

import "testing"

// WithoutWALInspect makes the runs of test t look for an extension no
// server offers instead of pg_walinspect, as a run on an old cluster
// without it (PostgreSQL 13 and 14, or 15+ without contrib) does: every
// database is subscribed.
func WithoutWALInspect(t testing.TB) {
	was := walInspect
	walInspect = "pgfork_test_no_such_extension"
	t.Cleanup(func() { walInspect = was })
}
