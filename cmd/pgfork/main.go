// Command pgfork makes copies of PostgreSQL data fast: directory trees, whole
// clusters, databases inside a running server, and pools of test databases.
//
// The CLI is thin: each command lives in its own file, parses flags, calls
// the packages that do the work and prints. Exit codes are stable and
// documented in exitcodes.go and `pgfork --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:]))
}
