package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// errTooSlow is what a transfer's watch returns when its client moved
// fewer than limits.minTransferRate bytes a second over a window.
var errTooSlow = errors.New("transfer too slow")

// rateWatch holds a transfer to limits.minTransferRate: the bytes that
// pass during each limits.minTransferRateWindow of the server waiting on
// the client — an upload's Recv, a download's Send — must average at
// least the rate. Time the server spends on storage does not count, so
// a slow store never makes a client look slow. A wait that goes on
// (a client that sends or reads nothing) is judged when the window's
// waiting time is up: lapsed tells how long that is.
//
// A rateWatch is used by one goroutine at a time.
type rateWatch struct {
	rate   int64
	window time.Duration
	now    func() time.Time

	waited time.Duration // waiting on the client, in this window
	bytes  int64         // moved, in this window
	since  time.Time     // start of the wait in progress
}

func (s *Service) newRateWatch() *rateWatch {
	return &rateWatch{rate: s.limits.MinTransferRate, window: s.limits.MinTransferRateWindow.Duration, now: s.now}
}

// wait marks the start of a wait on the client.
func (w *rateWatch) wait() { w.since = w.now() }

// left is how long the wait in progress may go on before the window is
// judged.
func (w *rateWatch) left() time.Duration {
	return max(0, w.window-w.waited-w.now().Sub(w.since))
}

// moved ends the wait in progress, which moved n bytes, and judges the
// window if its waiting time is up: errTooSlow if its bytes averaged
// less than the rate, else a new window starts.
func (w *rateWatch) moved(n int) error {
	now := w.now()
	w.waited += now.Sub(w.since)
	w.bytes += int64(n)
	w.since = now
	return w.judge()
}

// lapsed judges the window when the wait in progress ran out its time
// (left reached 0): errTooSlow unless the window's bytes already
// make the rate; then a new window starts and the wait goes on.
func (w *rateWatch) lapsed() error {
	now := w.now()
	w.waited += now.Sub(w.since)
	w.since = now
	return w.judge()
}

func (w *rateWatch) judge() error {
	if w.waited < w.window {
		return nil
	}
	// bytes / waited < rate
	if float64(w.bytes) < float64(w.rate)*w.waited.Seconds() {
		return errTooSlow
	}
	w.waited, w.bytes = 0, 0
	return nil
}

// tooSlow is the status of a transfer ended by its watch.
func (s *Service) tooSlow(what string, done int64) error {
	return status.Errorf(codes.ResourceExhausted,
		"%s ended after %d bytes: the transfer was too slow, under %s over %s (limits.minTransferRate over limits.minTransferRateWindow); "+
			"use a faster link, or ask the server's operator to lower the limit",
		what, done, rateString(s.limits.MinTransferRate), s.limits.MinTransferRateWindow.Duration)
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

// sendWatch is a download stream whose sends are held to
// limits.minTransferRate: the time each SendMsg waits is the client's
// (gRPC's flow control blocks it while the client does not read).
type sendWatch struct {
	stream  interface{ SendMsg(any) error }
	mu      sync.Mutex
	watch   *rateWatch
	waiting bool
	sent    int64
	// kick tells sendWatched that a wait started or ended.
	kick chan struct{}
}

// SendMsg sends m, timing the wait.
func (w *sendWatch) SendMsg(m any) error {
	n := 0
	if c, ok := m.(*chunkOut); ok {
		n = c.data.Len()
	}
	w.mu.Lock()
	w.waiting = true
	w.watch.wait()
	w.mu.Unlock()
	w.poke()
	err := w.stream.SendMsg(m)
	w.mu.Lock()
	w.waiting = false
	if err == nil {
		w.sent += int64(n)
		if werr := w.watch.moved(n); werr != nil {
			err = werr
		}
	}
	w.mu.Unlock()
	w.poke()
	return err
}

func (w *sendWatch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// sendWatched runs send, a download's sending of its chunks, on a
// goroutine of its own and ends the download with ResourceExhausted when
// its client reads slower than limits.minTransferRate. A send blocked on
// a client that reads nothing can only be ended by the stream's end:
// this handler returns, and gRPC cancels the stream, which ends the
// blocked send and the goroutine with it.
func (s *Service) sendWatched(ctx context.Context, stream interface{ SendMsg(any) error }, d *download, offset int64, send func(*sendWatch) error) error {
	w := &sendWatch{stream: stream, watch: s.newRateWatch(), kick: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- send(w) }()
	slow := func() error {
		w.mu.Lock()
		sent := w.sent
		w.mu.Unlock()
		s.log.Warn("download aborted: too slow", "location", d.locName, "backup", d.name, "offset", offset, "sent", sent,
			"minTransferRate", s.limits.MinTransferRate, "window", s.limits.MinTransferRateWindow.Duration, "caller", caller(ctx))
		return s.tooSlow(fmt.Sprintf("download of %q from byte %d", d.name, offset), sent)
	}
	for {
		w.mu.Lock()
		var timeout <-chan time.Time
		var t *time.Timer
		if w.waiting {
			t = time.NewTimer(w.watch.left())
			timeout = t.C
		}
		w.mu.Unlock()
		select {
		case err := <-done:
			if t != nil {
				t.Stop()
			}
			if errors.Is(err, errTooSlow) {
				return slow()
			}
			return err
		case <-w.kick:
		case <-s.handoff:
			w.mu.Lock()
			sent := w.sent
			w.mu.Unlock()
			s.log.Info("download handed off: this replica is shutting down, the client resumes on another",
				"location", d.locName, "backup", d.name, "offset", offset, "sent", sent, "caller", caller(ctx))
			return ebv1.ServerErrorf(codes.Unavailable,
				"this server replica is shutting down after %d bytes of %q from byte %d; resume the download on another replica", sent, d.name, offset)
		case <-timeout:
			w.mu.Lock()
			var err error
			if w.waiting {
				err = w.watch.lapsed()
			}
			w.mu.Unlock()
			if err != nil {
				return slow()
			}
		}
		if t != nil {
			t.Stop()
		}
	}
}
