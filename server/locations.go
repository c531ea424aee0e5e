package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
)

const (
	// openAttemptTimeout bounds one attempt to open or check a location: a
	// store that accepts connections but never answers (a stopped process)
	// delays the server's start by this much at most.
	openAttemptTimeout = 10 * time.Second
	// retryCap is the longest wait between two attempts to reach an
	// unavailable location: it is back at most this long after its store.
	retryCap = 30 * time.Second
)

// retryBackoff is the wait between attempts to reach an unavailable
// location: 1 s, doubling up to retryCap, with jitter so that several
// servers do not probe a recovering store in step.
var retryBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: retryCap}

// UnavailableError is the error of every call to a location that could
// not be opened at start or stopped answering since: it names the
// location, says why and since when.
type UnavailableError struct {
	Location string
	Since    time.Time
	Err      error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("storage location %q is unavailable: %v; the server retries in the background (since %s)",
		e.Location, e.Err, e.Since.UTC().Format(time.RFC3339))
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// OpenLocations opens the storage locations of a configuration, in order,
// for Config.Locations. An S3 location checks that its bucket is reachable
// and logs to log under its name.
//
// Only an invalid configuration is an error. A location that cannot be
// opened (its store unreachable, its bucket missing, its directory not
// writable) is returned all the same, reported unavailable with its error,
// and opened again in the background until it works or ctx is done: the
// server serves its other locations meanwhile. The same happens to a
// location that stops answering later. ctx owns those retries: pass the
// context that stops the server.
func OpenLocations(ctx context.Context, locs []config.Location, log *slog.Logger) ([]NamedLocation, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	openers := make([]locationOpener, 0, len(locs))
	for i, l := range locs {
		o, err := newOpener(l, log)
		if err != nil {
			return nil, fmt.Errorf("locations[%d] (%q): %w", i, l.Name, err)
		}
		openers = append(openers, o)
	}
	return openAll(ctx, openers, retryBackoff, openAttemptTimeout, log), nil
}

// locationOpener is what it takes to open one location, known before its
// store answers.
type locationOpener struct {
	name, typ, where string
	open             func(context.Context) (storage.Location, error)
}

// newOpener checks a location's configuration: its errors are the only
// ones retrying cannot fix.
func newOpener(l config.Location, log *slog.Logger) (locationOpener, error) {
	o := locationOpener{name: l.Name}
	switch {
	case l.Filesystem != nil && l.S3 == nil:
		path := l.Filesystem.Path
		if path == "" {
			return o, errors.New("filesystem.path is required")
		}
		o.typ, o.where = "filesystem", path
		o.open = func(context.Context) (storage.Location, error) { return filesystem.New(path) }
	case l.S3 != nil && l.Filesystem == nil:
		cfg := s3.Config{S3Config: *l.S3, Logger: log.With("location", l.Name)}
		if err := cfg.Validate(); err != nil {
			return o, err
		}
		o.typ, o.where = "s3", cfg.Describe()
		o.open = func(ctx context.Context) (storage.Location, error) { return s3.New(ctx, cfg) }
	default:
		return o, errors.New("must have exactly one of filesystem, s3")
	}
	return o, nil
}

// openAll opens every location at once, each attempt bounded by
// attempt, and starts retrying those that failed.
func openAll(ctx context.Context, openers []locationOpener, backoff wait.Backoff, attempt time.Duration, log *slog.Logger) []NamedLocation {
	out := make([]NamedLocation, len(openers))
	var wg sync.WaitGroup
	for i, o := range openers {
		l := &managedLocation{
			locationOpener: o, ctx: ctx, backoff: backoff, attempt: attempt,
			log: log.With("location", o.name), now: time.Now,
		}
		out[i] = NamedLocation{Name: o.name, Location: l}
		wg.Go(func() {
			if l.try(false) {
				return
			}
			_, err := l.unavailable()
			l.log.Warn("storage location unavailable: the other locations are served; retrying in the background",
				"type", l.typ, "where", l.where, "error", err)
			l.mu.Lock()
			l.startRetry()
			l.mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// managedLocation is a storage location as the server holds it: it knows
// whether the store answers and, while it does not, refuses calls at once
// with an UnavailableError and tries to reach it again in the background.
type managedLocation struct {
	locationOpener
	ctx     context.Context // owns the retry goroutine
	backoff wait.Backoff
	attempt time.Duration
	log     *slog.Logger
	now     func() time.Time

	mu       sync.Mutex
	loc      storage.Location // nil until opened
	err      error            // why it is unavailable; nil when available
	since    time.Time
	retrying bool
}

var _ storage.Location = (*managedLocation)(nil)

// unavailable returns why the location cannot be used and since when, or
// a nil error.
func (l *managedLocation) unavailable() (time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loc == nil && l.err == nil {
		// Not opened and no attempt finished yet.
		return l.since, errors.New("not opened yet")
	}
	return l.since, l.err
}

// get returns the open location, or an UnavailableError.
func (l *managedLocation) get() (storage.Location, error) {
	since, err := l.unavailable()
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
func (l *managedLocation) try(retrying bool) bool {
	ctx, cancel := context.WithTimeout(l.ctx, l.attempt)
	defer cancel()
	l.mu.Lock()
	loc := l.loc
	l.mu.Unlock()
	var err error
	if loc == nil {
		loc, err = l.open(ctx)
	} else if c, ok := loc.(storage.Checker); ok {
		err = c.Check(ctx)
	}
	// (A location that cannot check itself is taken to be back after one
	// wait: the next call finds out.)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && l.ctx.Err() == nil {
		err = fmt.Errorf("no answer within %s: %w", l.attempt, err)
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
func (l *managedLocation) startRetry() {
	if l.retrying || l.ctx.Err() != nil {
		return
	}
	l.retrying = true
	go l.retry()
}

// retry attempts to reach the location, with backoff, until it answers or
// l.ctx is done.
func (l *managedLocation) retry() {
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

// failed looks at the error of a call: one that says the store did not
// answer (a network error or timeout, not the caller giving up) marks the
// location unavailable, starts the retries, and comes back as an
// UnavailableError. Other errors are returned as they are.
func (l *managedLocation) failed(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || !unreachable(err) {
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
	return &UnavailableError{Location: l.name, Since: l.since, Err: err}
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

func (l *managedLocation) Type() string     { return l.typ }
func (l *managedLocation) Describe() string { return l.where }

func (l *managedLocation) Create(ctx context.Context, name string) (storage.Upload, error) {
	loc, err := l.get()
	if err != nil {
		return nil, err
	}
	up, err := loc.Create(ctx, name)
	if err != nil {
		return nil, l.failed(ctx, err)
	}
	return &managedUpload{Upload: up, l: l, ctx: ctx}, nil
}

func (l *managedLocation) Open(ctx context.Context, name string, offset, length int64) (io.ReadCloser, *storage.Manifest, error) {
	loc, err := l.get()
	if err != nil {
		return nil, nil, err
	}
	r, m, err := loc.Open(ctx, name, offset, length)
	if err != nil {
		return nil, nil, l.failed(ctx, err)
	}
	return &managedReader{ReadCloser: r, l: l, ctx: ctx}, m, nil
}

func (l *managedLocation) Stat(ctx context.Context, name string) (*storage.Manifest, error) {
	loc, err := l.get()
	if err != nil {
		return nil, err
	}
	m, err := loc.Stat(ctx, name)
	return m, l.failed(ctx, err)
}

func (l *managedLocation) List(ctx context.Context) ([]*storage.Manifest, error) {
	loc, err := l.get()
	if err != nil {
		return nil, err
	}
	ms, err := loc.List(ctx)
	return ms, l.failed(ctx, err)
}

func (l *managedLocation) Delete(ctx context.Context, name string) error {
	loc, err := l.get()
	if err != nil {
		return err
	}
	return l.failed(ctx, loc.Delete(ctx, name))
}

// managedUpload notices a store that stops answering during an upload.
type managedUpload struct {
	storage.Upload
	l   *managedLocation
	ctx context.Context
}

func (u *managedUpload) Write(p []byte) (int, error) {
	n, err := u.Upload.Write(p)
	return n, u.l.failed(u.ctx, err)
}

func (u *managedUpload) Commit(ctx context.Context, m *storage.Manifest) error {
	return u.l.failed(ctx, u.Upload.Commit(ctx, m))
}

// managedReader notices a store that stops answering during a download.
type managedReader struct {
	io.ReadCloser
	l   *managedLocation
	ctx context.Context
}

func (r *managedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == io.EOF {
		return n, err
	}
	return n, r.l.failed(r.ctx, err)
}

// locationStatus is how GetServerInfo and location() learn whether a
// location can be used; a location without it always can.
type locationStatus interface {
	unavailable() (time.Time, error)
}
