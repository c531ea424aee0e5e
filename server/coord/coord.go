// Package coord keeps what the server's replicas must agree on while
// they work: which backup names are being uploaded, which backups are
// being sent, and which are being removed. Local keeps it in one
// replica's memory; Leases keeps it, in addition, in Leases of the
// server's namespace, where every replica sees it.
package coord

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Registry is what a replica asks before it stores a new name, sends a
// backup, or removes one.
type Registry interface {
	// ClaimUpload marks an upload of backup name to location loc as in
	// progress until release. One in progress already, here or on another
	// replica, fails it with AlreadyExists.
	ClaimUpload(ctx context.Context, loc, name string) (release func(), err error)
	// Send marks loc/name as being sent (a download) until done, so that
	// retention leaves it alone. A backup being removed fails it with
	// NotFound.
	Send(ctx context.Context, loc, name string) (done func(), err error)
	// Remove marks loc/name as being removed until done, so that sending
	// it is refused meanwhile; ok is false, and nothing is marked, while it
	// is being sent or removed anywhere. An error means it cannot be told:
	// the caller keeps the backup.
	Remove(ctx context.Context, loc, name string) (done func(), ok bool, err error)
}

// Local is a Registry for one replica: its own memory.
type Local struct {
	mu       sync.Mutex
	uploads  map[string]bool
	sends    map[string]int
	removing map[string]bool
}

var _ Registry = (*Local)(nil)

// NewLocal returns an empty Local.
func NewLocal() *Local {
	return &Local{uploads: map[string]bool{}, sends: map[string]int{}, removing: map[string]bool{}}
}

func key(loc, name string) string { return loc + "/" + name }

// ClaimUpload implements Registry.
func (l *Local) ClaimUpload(_ context.Context, loc, name string) (func(), error) {
	k := key(loc, name)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.uploads[k] {
		return nil, uploadInProgress(loc, name, "")
	}
	l.uploads[k] = true
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.uploads, k)
	}, nil
}

// Send implements Registry.
func (l *Local) Send(_ context.Context, loc, name string) (func(), error) {
	k := key(loc, name)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.removing[k] {
		return nil, beingRemoved(loc, name)
	}
	l.sends[k]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.sends[k]--; l.sends[k] <= 0 {
			delete(l.sends, k)
		}
	}, nil
}

// Remove implements Registry.
func (l *Local) Remove(_ context.Context, loc, name string) (func(), bool, error) {
	k := key(loc, name)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sends[k] > 0 || l.removing[k] {
		return nil, false, nil
	}
	l.removing[k] = true
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.removing, k)
	}, true, nil
}

func uploadInProgress(loc, name, replica string) error {
	where := ""
	if replica != "" {
		where = " (on server replica " + replica + ")"
	}
	return status.Errorf(codes.AlreadyExists,
		"an upload of backup %q to location %q is already in progress%s; backups are immutable, choose another name", name, loc, where)
}

func beingRemoved(loc, name string) error {
	return status.Errorf(codes.NotFound, "backup %q in location %q is being removed by retention", name, loc)
}
