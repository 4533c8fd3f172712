package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgfork/pgfork/internal/units"
)

// machineGuard watches the machine while a run that may exhaust it goes
// on (upgrade --logical with a thousand databases: a WAL sender, an apply
// worker and connections per database): it keeps the least memory
// available (MemAvailable), the most processes and the highest one-minute
// load it saw, and calls stop once available memory falls below floor or
// the run passes limit, so that the run ends by its own rollback instead
// of the kernel's OOM killer ending the machine's other work. What it saw
// is the measure of the bound that stopped the run.
type machineGuard struct {
	mu       sync.Mutex
	minAvail uint64
	maxProcs int
	maxLoad  float64
	reason   string
	quit     chan struct{}
	done     chan struct{}
}

// startGuard samples every half second until end is called.
func startGuard(floor uint64, limit time.Duration, stop func()) *machineGuard {
	g := &machineGuard{quit: make(chan struct{}), done: make(chan struct{})}
	t0 := time.Now()
	go func() {
		defer close(g.done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			avail, procs, load := memAvailable(), processCount(), load1()
			g.mu.Lock()
			if avail > 0 && (g.minAvail == 0 || avail < g.minAvail) {
				g.minAvail = avail
			}
			g.maxProcs, g.maxLoad = max(g.maxProcs, procs), max(g.maxLoad, load)
			if g.reason == "" {
				switch {
				case avail > 0 && avail < floor:
					g.reason = fmt.Sprintf("the memory available fell to %s (below %s) after %s", units.Bytes(int64(avail)), units.Bytes(int64(floor)), Dur(time.Since(t0)))
				case time.Since(t0) > limit:
					g.reason = fmt.Sprintf("the run passed %s", Dur(limit))
				}
				if g.reason != "" {
					g.mu.Unlock()
					stop()
					g.mu.Lock()
				}
			}
			g.mu.Unlock()
			select {
			case <-g.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return g
}

// end stops the sampling and returns why the guard stopped the run ("" if
// it did not).
func (g *machineGuard) end() string {
	close(g.quit)
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reason
}

// String says what the guard saw.
func (g *machineGuard) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return fmt.Sprintf("memory available at least %s, up to %d processes, one-minute load up to %.0f", units.Bytes(int64(g.minAvail)), g.maxProcs, g.maxLoad)
}

// memAvailable is /proc/meminfo's MemAvailable in bytes (0 if unknown).
func memAvailable() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// processCount is the number of processes on the machine.
func processCount() int {
	es, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range es {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}

// load1 is the one-minute load average.
func load1() float64 {
	f := strings.Fields(loadavg())
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
