package domain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// Location is one configured storage location: the store, every call
// to which is counted in etcdbackup_storage_errors_total when it fails
// for a reason of the storage's, and the name clients address it by. Its
// listings leave out location checks' probes (List).
type Location struct {
	Name string
	storage.Location
	// Copies are the names of the locations this one's backups are
	// copied to.
	Copies []string
	// opened is the location as locations.Open returned it: what knows
	// whether it is available.
	opened storage.Location

	// ledger appends to the location's audit ledger, made at the first
	// Record once the store is open (ledger.go).
	ledgerMu sync.Mutex
	ledger   *ledger.Writer
	// counted counts the ledger's failures with the store's other ones
	// (nil: counted nowhere).
	counted *counted
}

// Unavailable is the error of a location that cannot be used now (its
// store does not answer; retried in the background), or nil.
func (l *Location) Unavailable() *locations.UnavailableError {
	since, err := locations.Status(l.opened)
	if err == nil {
		return nil
	}
	return &locations.UnavailableError{Location: l.Name, Since: since, Err: err}
}

// List implements storage.Location: the store's backups and their parts,
// without the probes of location checks (storage.IsProbe), which are no
// backups. Everything above this package lists through here; a location
// check lists through the store itself (the Location field).
func (l *Location) List(ctx context.Context) ([]*storage.Manifest, error) {
	ms, err := l.Location.List(ctx)
	return storage.WithoutProbes(ms), err
}

// SetVerification implements storage.VerificationWriter for a store that
// can record a drill's verdict.
func (l *Location) SetVerification(ctx context.Context, name string, v *storage.Verification) error {
	w, ok := l.Location.(storage.VerificationWriter)
	if !ok {
		return fmt.Errorf("storage location %q (%s) cannot record a drill's verdict", l.Name, l.Type())
	}
	return w.SetVerification(ctx, name, v)
}

// Locations are the configured storage locations in order; the first is
// the default. Built once (server.New, breakglass.Open) and shared by
// the request layer, the controller and retention, so that the set and
// its default rule are spelled in one place.
type Locations struct {
	all    []*Location
	byName map[string]*Location
}

// NewLocations returns the set of named, in order, each counted in m's
// storage errors (nil m counts nothing). named must be non-empty, its
// names unique (storage.ValidateLocationNames).
func NewLocations(named []locations.Named, m *metrics.Metrics) (*Locations, error) {
	if len(named) == 0 {
		return nil, errors.New("at least one storage location is required")
	}
	ls := &Locations{byName: map[string]*Location{}}
	for _, n := range named {
		if _, dup := ls.byName[n.Name]; dup {
			return nil, fmt.Errorf("storage location %q is configured twice", n.Name)
		}
		l := &Location{Name: n.Name, Location: n.Location, opened: n.Location, Copies: n.Copies}
		if m != nil {
			l.counted = &counted{Location: n.Location, name: n.Name, metrics: m}
			l.Location = l.counted
		}
		ls.all = append(ls.all, l)
		ls.byName[n.Name] = l
	}
	for _, l := range ls.all {
		for _, c := range l.Copies {
			if _, ok := ls.byName[c]; !ok {
				return nil, fmt.Errorf("storage location %q is copied to %q, which is not configured", l.Name, c)
			}
		}
	}
	return ls, nil
}

// CopiedFrom are the locations whose backups are copied to the one
// called name.
func (ls *Locations) CopiedFrom(name string) []*Location {
	var out []*Location
	for _, l := range ls.all {
		if slices.Contains(l.Copies, name) {
			out = append(out, l)
		}
	}
	return out
}

// All are the locations in order, the default first.
func (ls *Locations) All() []*Location { return ls.all }

// Names are the locations' names in order.
func (ls *Locations) Names() []string {
	out := make([]string, len(ls.all))
	for i, l := range ls.all {
		out[i] = l.Name
	}
	return out
}

// Default is the first location.
func (ls *Locations) Default() *Location { return ls.all[0] }

// Lookup is the location called name, available or not.
func (ls *Locations) Lookup(name string) (*Location, bool) {
	l, ok := ls.byName[name]
	return l, ok
}

// Get resolves a location a request or a piece of work names ("" is the
// default): a *NotConfiguredError when there is none of the name, a
// *locations.UnavailableError when it cannot be used now.
func (ls *Locations) Get(name string) (*Location, error) {
	if name == "" {
		name = ls.Default().Name
	}
	l, ok := ls.Lookup(name)
	if !ok {
		return nil, &NotConfiguredError{Kind: KindLocation, Name: name, Have: ls.Names()}
	}
	if ue := l.Unavailable(); ue != nil {
		return nil, ue
	}
	return l, nil
}

// OfTarget is the name of the location t's backups go to: its own, else
// the default.
func (ls *Locations) OfTarget(t config.Target) string {
	return cmp.Or(t.Location, ls.Default().Name)
}
