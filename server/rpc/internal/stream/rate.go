package stream

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// ErrTooSlow is what a transfer's watch returns when its client moved
// fewer than limits.minTransferRate bytes a second over a window.
var ErrTooSlow = errors.New("transfer too slow")

// RateWatch holds a transfer to limits.minTransferRate: the bytes that
// pass during each limits.minTransferRateWindow of the server waiting on
// the client — an upload's Recv, a download's Send — must average at
// least the rate. Time the server spends on storage does not count, so
// a slow store never makes a client look slow. A wait that goes on
// (a client that sends or reads nothing) is judged when the window's
// waiting time is up: Lapsed tells how long that is.
//
// A RateWatch is used by one goroutine at a time.
type RateWatch struct {
	rate   int64
	window time.Duration
	now    func() time.Time

	waited time.Duration // waiting on the client, in this window
	bytes  int64         // moved, in this window
	since  time.Time     // start of the wait in progress
}

// NewRateWatch holds a transfer to lim's minTransferRate over its
// minTransferRateWindow, on the clock now.
func NewRateWatch(lim config.Limits, now func() time.Time) *RateWatch {
	return &RateWatch{rate: lim.MinTransferRate, window: lim.MinTransferRateWindow.Duration, now: now}
}

// Wait marks the start of a wait on the client.
func (w *RateWatch) Wait() { w.since = w.now() }

// Left is how long the wait in progress may go on before the window is
// judged.
func (w *RateWatch) Left() time.Duration {
	return max(0, w.window-w.waited-w.now().Sub(w.since))
}

// Moved ends the wait in progress, which moved n bytes, and judges the
// window if its waiting time is up: ErrTooSlow if its bytes averaged
// less than the rate, else a new window starts.
func (w *RateWatch) Moved(n int) error {
	now := w.now()
	w.waited += now.Sub(w.since)
	w.bytes += int64(n)
	w.since = now
	return w.judge()
}

// Lapsed judges the window when the wait in progress ran out its time
// (Left reached 0): ErrTooSlow unless the window's bytes already
// make the rate; then a new window starts and the wait goes on.
func (w *RateWatch) Lapsed() error {
	now := w.now()
	w.waited += now.Sub(w.since)
	w.since = now
	return w.judge()
}

func (w *RateWatch) judge() error {
	if w.waited < w.window {
		return nil
	}
	// bytes / waited < rate
	if float64(w.bytes) < float64(w.rate)*w.waited.Seconds() {
		return ErrTooSlow
	}
	w.waited, w.bytes = 0, 0
	return nil
}

// TooSlow is the status of a transfer, what, ended by its watch after
// done bytes.
func TooSlow(what string, done int64, lim config.Limits) error {
	return status.Errorf(codes.ResourceExhausted,
		"%s ended after %d bytes: the transfer was too slow, under %s over %s (limits.minTransferRate over limits.minTransferRateWindow); "+
			"use a faster link, or ask the server's operator to lower the limit",
		what, done, rateString(lim.MinTransferRate), lim.MinTransferRateWindow.Duration)
}

// rateString says a rate in bytes a second as people read it.
func rateString(r int64) string {
	switch {
	case r >= 1<<20 && r%(1<<20) == 0:
		return fmt.Sprintf("%d MiB/s", r>>20)
	case r >= 1<<10 && r%(1<<10) == 0:
		return fmt.Sprintf("%d KiB/s", r>>10)
	}
	return fmt.Sprintf("%d bytes/s", r)
}
