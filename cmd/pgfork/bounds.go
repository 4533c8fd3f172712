package main

import (
	"strconv"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
)

// maxJobs bounds -j/--jobs: more parallel copies than this only add
// threads and open files (a copy is bound by the disk long before).
const maxJobs = 1024

// maxTTL bounds --ttl: a test cluster meant to live longer is not a
// throw-away cluster (and time.Time arithmetic stays far from overflow).
const maxTTL = 10 * 365 * 24 * time.Hour

// maxStopTimeout bounds down's --timeout.
const maxStopTimeout = 24 * time.Hour

// checkJobs validates -j/--jobs (0: one per core).
func checkJobs(jobs int) error {
	if jobs < 0 || jobs > maxJobs {
		return errs.New(errs.Usage, "bad --jobs %d: want 1 to %d (0: one per core)", jobs, maxJobs).
			WithHint("e.g. --jobs 8, or leave it out")
	}
	return nil
}

// checkIntRange validates a numeric flag or variable.
func checkIntRange(name string, v, lo, hi int, example string) error {
	if v < lo || v > hi {
		return errs.New(errs.Usage, "bad %s %d: want %d to %d", name, v, lo, hi).WithHint("e.g. %s", example)
	}
	return nil
}

// checkDuration validates a duration flag: 0 ≤ d ≤ hi.
func checkDuration(name string, d, hi time.Duration, example string) error {
	if d < 0 || d > hi {
		return errs.New(errs.Usage, "bad %s %s: want 0 to %s", name, d, hi).WithHint("e.g. %s", example)
	}
	return nil
}

// sparesFromEnv returns PGFORK_SPARES when set, strictly parsed.
func (cl *cli) sparesFromEnv() (int, bool, error) {
	v, ok := cl.lookupEnv(envSpares)
	if !ok || v == "" {
		return 0, false, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, false, errs.New(errs.Usage, "bad %s=%q: want a number", envSpares, v).
			WithHint("e.g. %s=2, or 0 for no spares", envSpares)
	}
	return n, true, nil
}
