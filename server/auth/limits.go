package auth

import (
	"context"
	"time"

	"k8s.io/client-go/util/flowcontrol"
)

// callerLimits gives each caller — a claimed pod, for agent tokens — a
// token bucket of its own, so that a caller who sends many tokens waits
// on its own bucket and not in a queue shared with everyone else. The
// buckets are kept in a bounded LRU: one evicted comes back full, which
// costs at most one burst, while the map cannot grow with the number of
// identities a flood claims.
type callerLimits struct {
	qps   float32
	burst int
	// maxWait is the longest a caller waits on its bucket; a caller
	// further behind is refused at once (its call comes back
	// Unavailable, which agents retry).
	maxWait time.Duration
	m       *lru[string, flowcontrol.RateLimiter]
}

// callerLimiterIdle is how long an unused bucket is kept: long enough to
// be full again by then at any rate used here.
const callerLimiterIdle = time.Minute

func newCallerLimits(qps float32, burst int, maxWait time.Duration, size int) *callerLimits {
	return &callerLimits{qps: qps, burst: burst, maxWait: maxWait, m: newLRU[string, flowcontrol.RateLimiter](size)}
}

// wait takes one token of caller's bucket, waiting for it at most
// maxWait (or until ctx ends). It reports whether it got one.
func (l *callerLimits) wait(ctx context.Context, caller string) bool {
	// The buckets run on the wall clock (flowcontrol's), so their
	// expiry does too, whatever clock the reviews' caches use.
	now := time.Now()
	lim := l.m.getOrPut(caller, now, now.Add(callerLimiterIdle), func() flowcontrol.RateLimiter {
		return flowcontrol.NewTokenBucketRateLimiter(l.qps, l.burst)
	})
	if lim.TryAccept() {
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, l.maxWait)
	defer cancel()
	// Wait returns at once, taking nothing, when the token would come
	// after wctx's deadline.
	return lim.Wait(wctx) == nil
}

// semaphore bounds work in flight; acquire waits at most a given time.
type semaphore chan struct{}

// acquire takes a slot within wait, or reports false; ctx's end is
// returned as its error.
func (s semaphore) acquire(ctx context.Context, wait time.Duration) (bool, error) {
	select {
	case s <- struct{}{}:
		return true, nil
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s <- struct{}{}:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (s semaphore) release() { <-s }
