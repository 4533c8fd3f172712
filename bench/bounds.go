package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lower bounds measured in the same run as the targets they bound: what no
// contender of a section can beat on this machine, so that a missed target
// says whether pgfork or the machine is short.

// cpuTimes is a snapshot of the machine's CPU time (/proc/stat's cpu line,
// in clock ticks): busy (all but idle and iowait) and total.
type cpuTimes struct{ busy, total uint64 }

// readCPU reads the snapshot; zero where /proc/stat is missing (not Linux).
func readCPU() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t
}

// busySince is the share of all cores kept busy since before (0 to 1; -1
// when not measured).
func (t cpuTimes) busySince(before cpuTimes) float64 {
	if t.total <= before.total || before.total == 0 {
		return -1
	}
	return float64(t.busy-before.busy) / float64(t.total-before.total)
}

// busyCell formats a busy share for a table ("—" when not measured).
func busyCell(share float64) string {
	if share < 0 {
		return "—"
	}
	return strconv.Itoa(int(share*100+0.5)) + "%"
}

// newBackendCost times, n times each in turns, a test's statements on a new
// connection to the database at url (connect, stmts, close: a new backend,
// its authentication and its cold caches) and the same statements on one
// open connection. Their difference is what any fresh database per test
// pays at least per test: a PostgreSQL backend serves one database.
func newBackendCost(ctx context.Context, url string, stmts []string, n int) (fresh, open Sample, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(ctx)
	run := func(c *pgx.Conn) error {
		for _, s := range stmts {
			if _, err := c.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
	s, err := MeasureInterleaved(n,
		Case{Fn: func(int) error {
			c, err := pgx.Connect(ctx, url)
			if err != nil {
				return err
			}
			defer c.Close(ctx)
			return run(c)
		}},
		Case{Fn: func(int) error { return run(conn) }})
	if err != nil {
		return nil, nil, err
	}
	return s[0], s[1], nil
}

// creationBound is the least time a run that takes need fresh databases,
// ready of them made before it began, spends creating the others at the
// bare CREATE DATABASE rate (databases a second, measured idle): the run
// cannot end sooner even if its tests took no time.
func creationBound(need, ready int, bare float64) time.Duration {
	if bare <= 0 || need <= ready {
		return 0
	}
	return time.Duration(float64(need-ready) / bare * float64(time.Second))
}
