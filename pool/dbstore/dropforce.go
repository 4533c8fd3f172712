package dbstore

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DropForce runs DROP DATABASE IF EXISTS name WITH (FORCE): the sessions
// connected to it are ended first. For a server shutting down, which must
// not wait for its clients (serve drops its test copies so).
func (c *SQLCreator) DropForce(ctx context.Context, name string) error {
	return dropForce(ctx, c.Admin, name)
}

// DropWorkers is how many databases dropAll (and serve at shutdown) drops at once: a DROP
// DATABASE is mostly the checkpoint it forces and the removal of its
// files, and concurrent drops share checkpoints (8 at once: ~25 ms a
// database instead of 60-100 ms, 2 cores).
const DropWorkers = 8

// dropAll drops names WITH (FORCE), dropWorkers at once; the first error
// is returned once every drop has ended.
func dropAll(ctx context.Context, admin *pgxpool.Pool, names []string) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan string)
	for range min(DropWorkers, len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range next {
				if err := dropForce(ctx, admin, n); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, n := range names {
		next <- n
	}
	close(next)
	wg.Wait()
	return first
}
