package locations

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// UnavailableError is the error of every call to a location that could
// not be opened or stopped answering since: it names the location, says
// why and since when.
type UnavailableError struct {
	Location string
	Since    time.Time
	Err      error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("storage location %q is unavailable: %v; it is retried in the background (since %s)",
		e.Location, e.Err, e.Since.UTC().Format(time.RFC3339))
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// Status says whether l (as Open returned it) is available: the zero time
// and nil, or since when and why not. A location Open did not return is
// always available.
func Status(l storage.Location) (since time.Time, err error) {
	m, ok := l.(*managed)
	if !ok {
		return time.Time{}, nil
	}
	return m.status()
}

// managed is a storage location as Open returns it: it knows whether the
// store answers and, while it does not, refuses calls at once with an
// UnavailableError and tries to reach it again in the background.
type managed struct {
	opener
	ctx     context.Context // owns the retry goroutine
	backoff wait.Backoff
	opts    Options
	log     *slog.Logger
	now     func() time.Time

	mu       sync.Mutex
	loc      storage.Location // nil until opened
	err      error            // why it is unavailable; nil when available
	since    time.Time
	retrying bool
}

var (
	_ storage.Location = (*managed)(nil)
	_ storage.Checker  = (*managed)(nil)
	_ storage.Wrapper  = (*managed)(nil)
)

// status returns why the location cannot be used and since when, or a
// nil error.
func (l *managed) status() (time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loc == nil && l.err == nil {
		// Not opened and no attempt finished yet.
		return l.since, errors.New("not opened yet")
	}
	if l.err == nil {
		return time.Time{}, nil
	}
	return l.since, l.err
}

// get returns the open location, or an UnavailableError.
func (l *managed) get() (storage.Location, error) {
	since, err := l.status()
	if err != nil {
		return nil, &UnavailableError{Location: l.name, Since: since, Err: err}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.loc, nil
}

// try makes one attempt to open the location, or to check it once open,
// and records the outcome. It reports whether the location is available;
// then, from the retry loop (retrying), it also ends the loop under the
// same lock, so a failure noticed right after starts a new one.
func (l *managed) try(retrying bool) bool {
	l.mu.Lock()
	loc := l.loc
	l.mu.Unlock()
	bound := l.opts.OpenTimeout
	if loc != nil {
		bound = l.opts.CallTimeout
	}
	ctx, cancel := context.WithTimeout(l.ctx, bound)
	defer cancel()
	var err error
	if loc == nil {
		loc, err = l.open(ctx)
	} else if c, ok := loc.(storage.Checker); ok {
		err = c.Check(ctx)
	}
	// (A location that cannot check itself is taken to be back after one
	// wait: the next call finds out.)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && l.ctx.Err() == nil {
		err = fmt.Errorf("no answer within %s: %w", bound, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if l.err == nil {
			l.since = l.now()
		}
		l.err = err
		return false
	}
	l.loc, l.err = loc, nil
	if retrying {
		l.retrying = false
	}
	return true
}

// startRetry starts the background attempts unless they run. l.mu is held.
func (l *managed) startRetry() {
	if l.retrying || l.ctx.Err() != nil {
		return
	}
	l.retrying = true
	go l.retry()
}

// retry attempts to reach the location, with backoff, until it answers or
// l.ctx is done.
func (l *managed) retry() {
	b := l.backoff
	for {
		t := time.NewTimer(b.Step())
		select {
		case <-l.ctx.Done():
			t.Stop()
			l.mu.Lock()
			l.retrying = false
			l.mu.Unlock()
			return
		case <-t.C:
		}
		if l.try(true) {
			l.log.Info("storage location available again", "type", l.typ, "where", l.where)
			return
		}
	}
}

// failed looks at the error of a call to the store, made for a caller
// whose context is ctx; timedOut is the call's bound if it passed. A
// call that outlived its bound, or failed with a network error, says the
// store does not answer (unless the caller gave up first): the location
// is marked unavailable, the retries start, and the error comes back as
// an UnavailableError. Other errors are returned as they are.
func (l *managed) failed(ctx context.Context, err, timedOut error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return err
	case timedOut != nil:
		err = timedOut
	case !unreachable(err):
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err, l.since = err, l.now()
		l.log.Warn("storage location stopped answering: calls to it are refused until it does; retrying in the background",
			"type", l.typ, "where", l.where, "error", err)
	}
	l.startRetry()
	return &UnavailableError{Location: l.name, Since: l.since, Err: l.err}
}

// unreachable reports an error of the network (refused, reset, timed
// out, DNS, an HTTP exchange that failed) below a store: the store, not
// the request, is at fault. Not any net.Error: a file system's
// syscall.Errno (ENOSPC) is one too.
func unreachable(err error) bool {
	var (
		op  *net.OpError
		dns *net.DNSError
		ue  *url.Error
	)
	return errors.As(err, &op) || errors.As(err, &dns) || errors.As(err, &ue)
}

// bound is the limit of one call to the store: the context the call is
// given, cancelled with cause once d has passed.
type bound struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	cause  error
}

// bound starts the clock of a call (op, for the error) on behalf of a
// caller whose context is ctx. A context with a deadline would not do
// for Open and Create: what they return lives on the call's context after
// they return, and a transfer that makes progress is not to be cut.
func (l *managed) bound(ctx context.Context, d time.Duration, op string) *bound {
	b := &bound{cause: fmt.Errorf("no answer within %s to %s", d, op)}
	b.ctx, b.cancel = context.WithCancelCause(ctx)
	b.timer = time.AfterFunc(d, func() { b.cancel(b.cause) })
	return b
}

// passed stops the clock once the call returned and says whether the
// bound passed first (then the call's context is, or is about to be,
// cancelled: whatever it returned is of no use).
func (b *bound) passed() error {
	if b.timer.Stop() {
		return nil
	}
	return b.cause
}

// release frees the call's context, once nothing lives on it.
func (b *bound) release() {
	b.timer.Stop()
	b.cancel(nil)
}

// Unwrap implements storage.Wrapper: the open location, nil until it
// is. A location check finds its store's storage.Prober through it; the
// check bounds those calls itself.
func (l *managed) Unwrap() storage.Location {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.loc
}

func (l *managed) Type() string     { return l.typ }
func (l *managed) Describe() string { return l.where }

func (l *managed) readOnly(op, name string) error {
	if !l.opts.ReadOnly {
		return nil
	}
	return fmt.Errorf("%s %q in storage location %q: %w", op, name, l.name, storage.ErrReadOnly)
}

func (l *managed) Create(ctx context.Context, name string) (storage.Upload, error) {
	if err := l.readOnly("create", name); err != nil {
		return nil, err
	}
	loc, err := l.get()
	if err != nil {
		return nil, err
	}
	b := l.bound(ctx, l.opts.CallTimeout, "create "+strconv.Quote(name))
	up, err := loc.Create(b.ctx, name)
	timedOut := b.passed()
	if err == nil && timedOut != nil {
		_ = up.Abort()
		err = timedOut
	}
	if err != nil {
		b.release()
		return nil, l.failed(ctx, err, timedOut)
	}
	return &managedUpload{Upload: up, l: l, ctx: ctx, release: b.release}, nil
}

func (l *managed) Open(ctx context.Context, name string, offset, length int64) (io.ReadCloser, *storage.Manifest, error) {
	loc, err := l.get()
	if err != nil {
		return nil, nil, err
	}
	b := l.bound(ctx, l.opts.CallTimeout, "open "+strconv.Quote(name))
	r, m, err := loc.Open(b.ctx, name, offset, length)
	timedOut := b.passed()
	if err == nil && timedOut != nil {
		_ = r.Close()
		err = timedOut
	}
	if err != nil {
		b.release()
		return nil, nil, l.failed(ctx, err, timedOut)
	}
	return &managedReader{ReadCloser: r, l: l, ctx: ctx, release: b.release}, m, nil
}

func (l *managed) Stat(ctx context.Context, name string) (*storage.Manifest, error) {
	loc, err := l.get()
	if err != nil {
		return nil, err
	}
	b := l.bound(ctx, l.opts.CallTimeout, "stat "+strconv.Quote(name))
	defer b.release()
	m, err := loc.Stat(b.ctx, name)
	return m, l.failed(ctx, err, b.passed())
}

func (l *managed) List(ctx context.Context) ([]*storage.Manifest, error) {
	loc, err := l.get()
	if err != nil {
		return nil, err
	}
	b := l.bound(ctx, l.opts.ListTimeout, "list")
	defer b.release()
	ms, err := loc.List(b.ctx)
	return ms, l.failed(ctx, err, b.passed())
}

func (l *managed) Delete(ctx context.Context, name string) error {
	if err := l.readOnly("delete", name); err != nil {
		return err
	}
	loc, err := l.get()
	if err != nil {
		return err
	}
	b := l.bound(ctx, l.opts.CallTimeout, "delete "+strconv.Quote(name))
	defer b.release()
	return l.failed(ctx, loc.Delete(b.ctx, name), b.passed())
}

// SetVerification implements storage.VerificationWriter, within the call
// bound, for a store that can.
func (l *managed) SetVerification(ctx context.Context, name string, v *storage.Verification) error {
	if err := l.readOnly("record the verification of", name); err != nil {
		return err
	}
	loc, err := l.get()
	if err != nil {
		return err
	}
	w, ok := loc.(storage.VerificationWriter)
	if !ok {
		return fmt.Errorf("storage location %q (%s) cannot record a drill's verdict", l.name, l.typ)
	}
	b := l.bound(ctx, l.opts.CallTimeout, "record the verification of "+strconv.Quote(name))
	defer b.release()
	return l.failed(ctx, w.SetVerification(b.ctx, name, v), b.passed())
}

// Check implements storage.Checker: the store answers now, within the
// call bound. A location that is unavailable says so at once; the
// background retries are what find out it is back.
func (l *managed) Check(ctx context.Context) error {
	loc, err := l.get()
	if err != nil {
		return err
	}
	c, ok := loc.(storage.Checker)
	if !ok {
		return nil
	}
	b := l.bound(ctx, l.opts.CallTimeout, "check")
	defer b.release()
	return l.failed(ctx, c.Check(b.ctx), b.passed())
}

// managedUpload notices a store that stops answering during an upload,
// and frees the bound's context once the upload is over.
type managedUpload struct {
	storage.Upload
	l       *managed
	ctx     context.Context
	release func()
}

func (u *managedUpload) Write(p []byte) (int, error) {
	n, err := u.Upload.Write(p)
	return n, u.l.failed(u.ctx, err, nil)
}

func (u *managedUpload) Commit(ctx context.Context, m *storage.Manifest) error {
	err := u.l.failed(ctx, u.Upload.Commit(ctx, m), nil)
	if err == nil {
		u.release()
	}
	return err
}

func (u *managedUpload) Abort() error {
	defer u.release()
	return u.Upload.Abort()
}

// managedReader notices a store that stops answering during a download,
// and frees the bound's context once closed.
type managedReader struct {
	io.ReadCloser
	l       *managed
	ctx     context.Context
	release func()
}

func (r *managedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == io.EOF {
		return n, err
	}
	return n, r.l.failed(r.ctx, err, nil)
}

func (r *managedReader) Close() error {
	defer r.release()
	return r.ReadCloser.Close()
}
