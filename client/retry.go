package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
)

// DefaultRetryTimeout is how long a call keeps retrying without progress
// unless Client.Retry says otherwise: longer than a replacement server pod
// usually takes to be scheduled, started and Ready.
const DefaultRetryTimeout = 2 * time.Minute

// maxBackoff caps the pause between two attempts, so a server that is back
// is found within seconds.
const maxBackoff = 5 * time.Second

// Reconnect is the dial option that keeps gRPC's own reconnection back-off
// within maxBackoff. Its default grows to 2 minutes: a channel that failed
// to connect while the server was away would fail every retry fast long
// after the server is back.
var Reconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxBackoff},
	MinConnectTimeout: 20 * time.Second,
})

// Retry says how calls survive a server that goes away for a while (a pod
// replaced, a tunnel dropped).
type Retry struct {
	// Timeout is how long a call keeps retrying while it makes no
	// progress; 0 does not retry.
	Timeout time.Duration
	// Flag names the setting of Timeout in give-up errors, e.g.
	// "--retry-timeout".
	Flag string
	// OnRetry, if set, is called once per outage, before its first retry,
	// with what broke and how long retries may go on.
	OnRetry func(err error, left time.Duration)
}

// GiveUpError is a call's last error after retrying for the whole budget.
type GiveUpError struct {
	// Op says what was being done, e.g. `download "big" at byte 1048576`.
	Op      string
	Timeout time.Duration
	Flag    string
	Err     error
}

func (e *GiveUpError) Error() string { return e.Op + ": " + e.Detail() }

// Detail is the error without Op: what was lost, for how long it was
// retried, what sets that, and the last failure.
func (e *GiveUpError) Detail() string {
	flag := ""
	if e.Flag != "" {
		flag = " (" + e.Flag + ")"
	}
	msg := e.Err.Error()
	if s, ok := status.FromError(e.Err); ok {
		msg = s.Message()
	}
	return fmt.Sprintf("connection to the server lost and not back after retrying for %s%s: %s", e.Timeout, flag, msg)
}

func (e *GiveUpError) Unwrap() error { return e.Err }

// Retrier follows the outages of one call: a budget that starts at the
// first failure after progress and ends Timeout later, and the back-off
// between attempts.
type Retrier struct {
	r        Retry
	op       func() string
	deadline time.Time // zero while no outage is under way
	backoff  wait.Backoff
}

// NewRetrier returns a Retrier for one call; op describes the call for
// the give-up error and is asked only then.
func (c *Client) NewRetrier(op func() string) *Retrier {
	return &Retrier{r: c.Retry, op: op}
}

// Progress ends the current outage, if any: the next failure gets a whole
// budget again.
func (r *Retrier) Progress() { r.deadline = time.Time{} }

// Check decides whether a call that failed with err may be made again:
// nil if err is transient and the budget has time left, otherwise the
// error to return (a *GiveUpError once the budget is spent).
func (r *Retrier) Check(ctx context.Context, err error) error {
	if !Transient(ctx, err) || r.r.Timeout <= 0 {
		return err
	}
	if r.deadline.IsZero() {
		r.deadline = time.Now().Add(r.r.Timeout)
		r.backoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: maxBackoff, Steps: math.MaxInt32}
		if r.r.OnRetry != nil {
			r.r.OnRetry(err, r.r.Timeout)
		}
		return nil
	}
	if time.Now().After(r.deadline) {
		return &GiveUpError{Op: r.op(), Timeout: r.r.Timeout, Flag: r.r.Flag, Err: err}
	}
	return nil
}

// Wait is Check followed by the back-off pause when the call may be made
// again; it returns early with ctx's error.
func (r *Retrier) Wait(ctx context.Context, err error) error {
	if err := r.Check(ctx, err); err != nil {
		return err
	}
	d := r.backoff.Step()
	if left := time.Until(r.deadline); left < d {
		d = max(left, 0)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Transient reports whether a failed call may succeed when made again:
// the transport broke (a tunnel dropped, a pod replaced) or one attempt
// timed out, not the request. Nothing is transient once ctx is done.
func Transient(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// One attempt's own deadline: ctx's has not passed.
		return true
	}
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.Unavailable:
		// The server answered that one of its storage locations is down:
		// it retries that itself; the user is better told at once.
		_, location := ebv1.UnavailableLocation(s)
		return !location
	case codes.Aborted, codes.DeadlineExceeded:
		return true
	case codes.Internal:
		// A stream torn mid-message surfaces as Internal from gRPC's
		// transport ("stream terminated by RST_STREAM", "unexpected
		// EOF"); the server marks its own Internal (a bug, a recovered
		// panic), which does not get better by asking again.
		return !ebv1.IsServerError(s)
	}
	return false
}
