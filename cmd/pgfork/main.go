// Command pgfork makes copies of PostgreSQL data fast: directory trees, whole
// clusters, databases inside a running server, and pools of test databases.
//
// Each command lives in its own file: it parses flags, calls the packages
// that do the work and prints; `up` and `serve` are one library call each
// (up.Up, serve.Run). A command tree is built per invocation by newCLI
// (root.go), with its streams and environment: nothing of one run is kept
// at package level, so tests run commands in-process. The CLI owns what only a command
// line has: exit codes (exitcodes.go, stable and listed in `pgfork --help`),
// the --json contract (jsonout.go, docs/cli.md), progress display
// (progress.go) and command-line advice in hints (errs.Error.CLI). It must
// not hold logic a server or library user would need.
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
	os.Exit(newCLI(osStreams()).run(ctx, os.Args[1:]))
}
