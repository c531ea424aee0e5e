// Package locations turns the configured `locations:` into opened storage
// backends and keeps track of whether each one answers, for the server and
// for the plugin's break-glass --storage-config access.
package locations

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
)

// The bounds of what a location waits for its store. A store that
// accepts connections but never answers (a stopped process, a hung
// appliance) would otherwise hold a call for as long as the S3 client's
// own timeouts allow — its ResponseTimeout (30 s) per attempt, up to 3
// attempts; a GET from versitygw under SIGSTOP failed after 30.2 s.
const (
	// DefaultOpenTimeout bounds one attempt to open a location: Open (the
	// server's start) waits this long at most for a store that does not
	// answer.
	DefaultOpenTimeout = 10 * time.Second
	// DefaultCallTimeout bounds each call a location makes to its store
	// but List: Stat, Open and Create until they return the reader or the
	// upload, Delete, and the background Check. Each is one to three
	// small requests (S3: a manifest's GET, a HEAD, two DELETEs), which a
	// store that works answers in milliseconds; 10 s is far above that
	// and short enough that a user waits for it once, after which calls
	// are refused at once.
	DefaultCallTimeout = 10 * time.Second
	// DefaultListTimeout bounds a List, which reads every manifest: on S3
	// one ListObjectsV2 per 1,000 keys and a GET per backup, 8 at a time.
	// A store answering each request within 100 ms lists some 2,000
	// backups in 30 s (a versitygw on the same two-core machine lists 500
	// in about a second); retention keeps tens to hundreds.
	DefaultListTimeout = 30 * time.Second

	// retryCap is the longest wait between two attempts to reach an
	// unavailable location: it is back at most this long after its store.
	retryCap = 30 * time.Second
)

// retryBackoff is the wait between attempts to reach an unavailable
// location: 1 s, doubling up to retryCap, with jitter so that several
// servers do not probe a recovering store in step.
var retryBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: retryCap}

// Options are how Open opens the locations.
type Options struct {
	// ReadOnly opens every location without writing anything to it: no
	// cleanup of interrupted uploads at open (filesystem: .tmp and orphan
	// removal; S3: CleanOrphans), and Create and Delete fail with
	// storage.ErrReadOnly.
	ReadOnly bool
	// Logger receives the locations' logs; nil discards them.
	Logger *slog.Logger
	// OpenTimeout, CallTimeout and ListTimeout bound the waits on a store
	// (see DefaultOpenTimeout, DefaultCallTimeout, DefaultListTimeout,
	// which zero means). Tests shorten them.
	OpenTimeout, CallTimeout, ListTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.OpenTimeout = cmp.Or(o.OpenTimeout, DefaultOpenTimeout)
	o.CallTimeout = cmp.Or(o.CallTimeout, DefaultCallTimeout)
	o.ListTimeout = cmp.Or(o.ListTimeout, DefaultListTimeout)
	return o
}

// Named is a storage location and the name clients address it by.
type Named struct {
	Name     string
	Location storage.Location
	// Copies are the locations Location's backups are copied to (its
	// configuration's copies).
	Copies []string
}

// Open opens the configured locations in order (validating the
// configuration first: its errors are the only error), each attempt
// bounded; one that cannot be opened is returned unavailable and retried
// in the background until ctx is done.
//
// A location that cannot be opened (its store unreachable, its bucket
// missing, its directory not writable) is returned all the same: Status
// reports it unavailable with its error, and its calls fail at once with
// an UnavailableError, while the other locations work. The same happens
// to a location whose store stops answering later (a network error, or a
// call that outlives its bound); a background Check finds out when it is
// back. ctx owns those retries: pass the context that ends the process's
// use of the locations.
func Open(ctx context.Context, cfgs []storage.LocationConfig, opts Options) ([]Named, error) {
	if errs := storage.ValidateLocations(cfgs, field.NewPath("locations")); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	opts = opts.withDefaults()
	openers := make([]opener, 0, len(cfgs))
	for i, c := range cfgs {
		o, err := newOpener(c, opts)
		if err != nil {
			return nil, fmt.Errorf("locations[%d] (%q): %w", i, c.Name, err)
		}
		openers = append(openers, o)
	}
	out := openAll(ctx, openers, retryBackoff, opts)
	for i := range out {
		out[i].Copies = storage.CopiesOf(cfgs, out[i].Name)
	}
	for i, n := range out {
		// A store that answers but cannot do what the configuration asks
		// (a bucket without object lock for a location that requires it)
		// is a configuration error: starting would break the promise.
		if _, err := Status(n.Location); errors.Is(err, storage.ErrMisconfigured) {
			return nil, fmt.Errorf("locations[%d] (%q): %w", i, n.Name, err)
		}
	}
	return out, nil
}

// opener is what it takes to open one location, known before its store
// answers.
type opener struct {
	name, typ, where string
	open             func(context.Context) (storage.Location, error)
}

// newOpener checks what validation of the schema cannot (an S3 CA bundle
// that is no PEM): configuration errors are the only ones retrying cannot
// fix.
func newOpener(c storage.LocationConfig, opts Options) (opener, error) {
	o := opener{name: c.Name}
	switch {
	case c.Filesystem != nil && c.S3 == nil:
		path := c.Filesystem.Path
		if path == "" {
			return o, errors.New("filesystem.path is required")
		}
		o.typ, o.where = "filesystem", path
		if opts.ReadOnly {
			o.open = func(context.Context) (storage.Location, error) { return filesystem.NewReadOnly(path) }
		} else if c.Filesystem.SharedVolume {
			o.open = func(context.Context) (storage.Location, error) { return filesystem.NewShared(path) }
		} else {
			o.open = func(context.Context) (storage.Location, error) { return filesystem.New(path) }
		}
	case c.S3 != nil && c.Filesystem == nil:
		cfg := s3.Config{S3Config: *c.S3, ReadOnly: opts.ReadOnly, Logger: opts.Logger.With("location", c.Name)}
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

// openAll opens every location at once and starts retrying those that
// failed.
func openAll(ctx context.Context, openers []opener, backoff wait.Backoff, opts Options) []Named {
	out := make([]Named, len(openers))
	var wg sync.WaitGroup
	for i, o := range openers {
		l := &managed{
			opener: o, ctx: ctx, backoff: backoff, opts: opts,
			log: opts.Logger.With("location", o.name), now: time.Now,
		}
		out[i] = Named{Name: o.name, Location: l}
		wg.Go(func() {
			if l.try(false) {
				return
			}
			_, err := l.status()
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
