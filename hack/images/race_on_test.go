//go:build race

package main

// raceEnabled: gzipping six release binaries inside a race-instrumented
// test binary takes many minutes, and the race detector has nothing to
// find in a single-goroutine image build.
const raceEnabled = true
