package serve

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/pgfork/pgfork/pool/dbstore"
)

// How `pgfork serve` spends the 2 s it has to exit after SIGTERM or SIGINT
// (docs/server.md, "Stopping and crashes"); the test glue of every client
// stops the server it started when the run ends (issue 34).
const (
	// httpGrace is how long requests in progress may finish before every
	// HTTP connection is closed. Requests waiting for a database are
	// answered 503 by then: the pools close at the same time.
	httpGrace = 500 * time.Millisecond
	// dropBudget is how long the test copies are dropped for. A DROP
	// DATABASE takes 60-100 ms (the server's checkpoint and file removal),
	// so one by one a pool of 32 took 3 s and more; several at once take
	// ~20-30 ms each. What is left when the budget is spent is dropped by
	// the next start (as after a crash), before it serves. Little is left
	// for it: the pools drop used copies as they are given back during a
	// run (pool's emptier), and their Close hands over what no creation
	// under way touches at once, not after the creations end (issue 58:
	// a stop during a fill of full copies queued its first drop 832 ms
	// into the budget and dropped none; 23-34 were left a stop).
	dropBudget = 800 * time.Millisecond
	// dropFinish bounds a drop begun within dropBudget: it may finish
	// after it (a DROP DATABASE cancelled near its end is rolled back,
	// and its copy left for the next start, for nothing).
	dropFinish = 2 * time.Second
)

// closingDrops is the creator of the modes with databases in one server: a
// dbstore.SQLCreator whose Drop, once the backend closes (start), queues
// the copy for workers that drop dbstore.DropWorkers at once (WITH (FORCE): a client
// still connected does not hold the shutdown up) and returns at once. The
// pools decide what is dropped (kept databases are not); this only makes
// the drops of their Close concurrent, so that it fits in dropBudget.
type closingDrops struct {
	*dbstore.SQLCreator

	qmu    sync.RWMutex
	queue  chan string // nil until start
	closed bool        // by wait
	wg     sync.WaitGroup
	began  time.Time // start

	mu      sync.Mutex
	dropped int
	left    int
	err     error
}

// Drop drops name now, or queues it once the backend closes.
func (d *closingDrops) Drop(ctx context.Context, name string) error {
	d.qmu.RLock()
	defer d.qmu.RUnlock()
	switch {
	case d.closed:
		d.count(context.Canceled, false) // the next start drops it
		return nil
	case d.queue == nil:
		return d.SQLCreator.Drop(ctx, name)
	}
	d.queue <- name
	return nil
}

func (d *closingDrops) count(err error, report bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		d.dropped++
		return
	}
	d.left++
	if report && d.err == nil {
		d.err = err
	}
}

// start switches Drop to queueing: workers begin the drops of what is
// queued until ctx ends (each may finish within dropFinish), then count
// the rest as left.
func (d *closingDrops) start(ctx context.Context) {
	q := make(chan string)
	d.qmu.Lock()
	d.queue, d.began = q, time.Now()
	d.qmu.Unlock()
	for range dbstore.DropWorkers {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			for name := range q {
				err := ctx.Err()
				if err == nil {
					fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropFinish)
					err = d.DropForce(fctx, name)
					cancel()
				}
				d.count(err, err != nil && ctx.Err() == nil)
			}
		}()
	}
}

// wait closes the queue (the pools have handed over everything) and waits
// for the workers; it says what the stop dropped, and what it left for
// the next start to drop.
func (d *closingDrops) wait() (summary string, err error) {
	d.qmu.Lock()
	q := d.queue
	d.closed = true
	d.qmu.Unlock()
	if q != nil {
		close(q)
		d.wg.Wait()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.left > 0:
		return fmt.Sprintf("dropped %d test databases in %.2f s; %d left for the next start to drop (it drops them before it serves)",
			d.dropped, time.Since(d.began).Seconds(), d.left), d.err
	case d.dropped > 0:
		return fmt.Sprintf("dropped %d test databases in %.2f s", d.dropped, time.Since(d.began).Seconds()), d.err
	}
	return "", d.err
}

// shutdownHTTP lets requests in progress finish for httpGrace, then
// closes every connection still open (idle keep-alive ones, ones that
// have sent nothing yet, long waits).
func shutdownHTTP(hs *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), httpGrace)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		_ = hs.Close()
	}
}
