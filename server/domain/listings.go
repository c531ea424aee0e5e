package domain

import (
	"context"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Listings are the locations' listings as read once: the controller's
// view of storage within one round, where the delta supervisor, the
// chain folds, the drill schedule and retention all read the same
// locations. A location is listed at most once until Forget (after
// something in it changed: a prune, a drill's verdict); a failed listing
// is kept too, so that a store that does not answer holds the round once,
// not once per reader. Not safe for concurrent use; callers must not
// modify what List returns.
type Listings struct {
	got map[string]listing
}

type listing struct {
	manifests []*storage.Manifest
	err       error
}

// NewListings returns an empty cache.
func NewListings() *Listings { return &Listings{got: map[string]listing{}} }

// List is l's listing: read now if it is not held.
func (ls *Listings) List(ctx context.Context, l *Location) ([]*storage.Manifest, error) {
	if got, ok := ls.got[l.Name]; ok {
		return got.manifests, got.err
	}
	ms, err := l.List(ctx)
	if ctx.Err() == nil {
		ls.got[l.Name] = listing{manifests: ms, err: err}
	}
	return ms, err
}

// Forget drops the listing of the location called name: the next List
// reads it again.
func (ls *Listings) Forget(name string) { delete(ls.got, name) }
