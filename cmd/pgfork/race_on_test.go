//go:build race

package main

// raceEnabled: this test binary, and so the pgfork it runs as a process
// (pgforkBinary), is built with the race detector, which slows it 2-10×.
const raceEnabled = true
