package dbclone

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/pgfork/pgfork/internal/errs"
)

// MaxCount bounds how many databases one bulk creation makes, and MaxJobs
// how many it makes at once (each job holds a server connection). Both are
// far above useful values; they keep a mistyped number from exhausting
// memory, connections or the disk.
const (
	MaxCount = 100000
	MaxJobs  = 64
)

// CheckJobs checks a bulk creation's concurrency against 1 … MaxJobs.
func CheckJobs(jobs int) error {
	if jobs < 1 || jobs > MaxJobs {
		return errs.New(errs.Usage, "jobs must be between 1 and %d, not %d", MaxJobs, jobs).
			WithHint("each job holds a server connection; 2 to 4 is usually fastest")
	}
	return nil
}

// CountNames returns the names --count n gives: prefix_1 … prefix_n. It
// fails (before any SQL) when n is outside 1 … MaxCount or the longest
// name would exceed 63 bytes.
func CountNames(prefix string, n int) ([]string, error) {
	if n < 1 || n > MaxCount {
		return nil, errs.New(errs.Usage, "count must be between 1 and %d, not %d", MaxCount, n).
			WithHint("create at most %d databases at a time", MaxCount)
	}
	if err := ValidateName(prefix); err != nil {
		return nil, err
	}
	if longest := prefix + "_" + strconv.Itoa(n); len(longest) > MaxNameBytes {
		return nil, errs.New(errs.Usage, "names %s_1 … %s are too long: %d bytes, PostgreSQL keeps at most %d", prefix, longest, len(longest), MaxNameBytes).
			WithHint("use a prefix of at most %d bytes", MaxNameBytes-len(longest)+len(prefix))
	}
	var out []string
	for i := range n {
		out = append(out, prefix+"_"+strconv.Itoa(i+1))
	}
	return out, nil
}

// ManyResult describes a bulk creation.
type ManyResult struct {
	Created  []string      `json:"created"`
	Strategy Strategy      `json:"strategy"`
	Advice   *Advice       `json:"advice,omitempty"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	// Rate is databases per second.
	Rate float64 `json:"rate_per_s"`
}

// CreateMany creates every database in names from template with at most
// jobs concurrent CREATE DATABASE statements, each on its own connection
// from connect. The strategy is resolved once (auto asks the advisor once).
// progress, when set, is called after each database with the count done
// (never concurrently).
// On the first failure it stops starting new ones and returns what it
// created with the error; the databases created are kept.
func CreateMany(ctx context.Context, connect func(context.Context) (*pgx.Conn, error), names []string, template string,
	opts CreateOptions, jobs int, progress func(done, total int)) (*ManyResult, error) {
	start := time.Now()
	for _, n := range names {
		if err := ValidateName(n); err != nil {
			return nil, err
		}
	}
	if err := CheckJobs(jobs); err != nil {
		return nil, err
	}
	jobs = min(jobs, max(len(names), 1))
	first, err := connect(ctx)
	if err != nil {
		return nil, err
	}
	conns := []*pgx.Conn{first}
	defer func() {
		for _, c := range conns {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}()
	if opts.Target == nil {
		if opts.Target, err = Inspect(ctx, first, false); err != nil {
			return nil, err
		}
	}
	res := &ManyResult{Strategy: opts.Strategy}
	if opts.Strategy == "" || opts.Strategy == Auto {
		adv, err := AdviseLearned(ctx, first, template, opts.Target, opts.Calibration, opts.Learning)
		if err != nil {
			return nil, err
		}
		res.Advice, res.Strategy = adv, adv.Choice
		opts.Strategy = adv.Choice
	}
	for len(conns) < jobs {
		c, err := connect(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	var (
		mu   sync.Mutex
		next atomic.Int64
	)
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range conns {
		g.Go(func() error {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) || gctx.Err() != nil {
					return nil
				}
				if _, err := Create(gctx, c, names[i], template, opts); err != nil {
					return err
				}
				mu.Lock()
				res.Created = append(res.Created, names[i])
				if progress != nil {
					progress(len(res.Created), len(names))
				}
				mu.Unlock()
			}
		})
	}
	err = g.Wait()
	res.Elapsed = time.Since(start)
	if s := res.Elapsed.Seconds(); s > 0 {
		res.Rate = float64(len(res.Created)) / s
	}
	if err == nil && ctx.Err() != nil {
		err = errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted after %d of %d databases", len(res.Created), len(names))
	}
	return res, err
}
