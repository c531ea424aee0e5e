package plugin

import "runtime/debug"

// listHeapLimit is the heap a short command lets grow before the
// garbage collector runs: far more than a list of thousands of backups
// takes.
const listHeapLimit = 64 << 20

// gcOnlyAtHeapLimit turns the garbage collector's pacing off up to
// listHeapLimit for a command that is over in tens of milliseconds and
// allocates a few MiB: its background workers otherwise take a core from
// the TLS handshakes and decoding on the way to the first answer (on two
// cores, 5–10 ms of a list). It returns the function that restores the
// settings.
func gcOnlyAtHeapLimit() (restore func()) {
	gc := debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(listHeapLimit)
	return func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(gc)
	}
}
