package testenv

import (
	"testing"
	"time"
)

// WaitTimeout bounds one wait of WaitFor: far beyond what any load on a
// shared machine makes of an event that comes (a make check on 2 loaded
// cores stretched a 2 s test to 64 s), yet a test that waits for one that
// never comes still fails within minutes.
const WaitTimeout = 3 * time.Minute

// WaitFor polls cond every 20 ms until it holds, and fails the test,
// saying what it waited for, if it did not within WaitTimeout. The
// deadline is this wait's own: one deadline shared by several waits lets
// a slow first wait eat the time of the last. A test's verdict should not
// hang on how long the wait took (slowness is the bench's to measure).
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s: it did not happen", WaitTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
