package pool_test

import (
	"testing"
	"time"

	"github.com/pgfork/pgfork/pool"
)

// BenchmarkQuickSuite measures what issue 14 measured: test packages of
// quick tests, run one after the other with 4 workers against a pool with
// serve's defaults on this machine (Initial = Parallel = 2), each test
// giving its database back for recreation. Before the pool grew toward
// demand every package drained it and most tests waited for a creation.
// It reports the time per suite and the acquires that waited.
func BenchmarkQuickSuite(b *testing.B) {
	s := startPG(b)
	const packages, workers, rounds = 4, 4, 3
	p := newPool(b, s, pool.Config{Initial: 2, Max: 32, Parallel: 2})
	waitFor(b, func() bool { return p.Stats().ByState[pool.Ready] == 2 })
	waited, total := 0, time.Duration(0)
	b.ResetTimer()
	for range b.N {
		for range packages {
			w, d := runSuite(b, p, workers, rounds)
			waited += w
			total += d
			time.Sleep(500 * time.Millisecond) // the next package compiles
		}
	}
	b.ReportMetric(float64(waited)/float64(b.N), "waited/suite")
	b.ReportMetric(total.Seconds()/float64(b.N), "s-in-tests/suite")
}
