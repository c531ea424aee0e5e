package domain

import (
	"errors"
	"fmt"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
)

// Errors the domain's operations return (wrapped, or as the typed errors
// below, which match them with errors.Is where one is named).
var (
	// ErrNoTargets: the server has no etcd targets at all.
	ErrNoTargets = errors.New("this server has no etcd targets configured")
	// ErrNoAgents: the server launches no agents (it runs outside a
	// cluster, or without an agent image).
	ErrNoAgents = errors.New("this server launches no agents")
	// ErrAlreadyRunning: an agent doing the same work runs already.
	ErrAlreadyRunning = errors.New("already running")
)

// What a NotConfiguredError is of.
const (
	KindLocation = "storage location"
	KindTarget   = "etcd target"
)

// NotConfiguredError is a storage location or an etcd target the server
// has none of by that name.
type NotConfiguredError struct {
	// Kind is KindLocation or KindTarget.
	Kind string
	Name string
	// Have are the names it has, in order.
	Have []string
}

func (e *NotConfiguredError) Error() string {
	return fmt.Sprintf("%s %q is not configured on this server; it has %v", e.Kind, e.Name, e.Have)
}

// AlreadyRunningError is work whose agent runs already: a backup being
// taken under the name, a drill of the backup.
type AlreadyRunningError struct {
	// Kind is "backup" or "drill".
	Kind string
	// Name is the backup's.
	Name string
}

func (e *AlreadyRunningError) Error() string {
	return fmt.Sprintf("the %s agent of backup %q is already running", e.Kind, e.Name)
}

func (e *AlreadyRunningError) Is(target error) bool { return target == ErrAlreadyRunning }

// PreconditionError is work that cannot start in the state things are
// in (the configuration, the backup, the cluster), so that retrying the
// same request does not help; Error is the whole sentence for the user,
// Err (may be nil) the cause, for errors.Is.
type PreconditionError struct {
	Msg string
	Err error
}

func (e *PreconditionError) Error() string { return e.Msg }
func (e *PreconditionError) Unwrap() error { return e.Err }

// ClusterError is a question the Kubernetes API could not answer (the
// agent Jobs could not be listed, say): Err says what was being asked and
// why it failed. Retrying may help.
type ClusterError struct{ Err error }

func (e *ClusterError) Error() string { return e.Err.Error() }
func (e *ClusterError) Unwrap() error { return e.Err }

// ReservedNameError is a name chosen for a backup that has the form of
// Target's own backups of Kind (Targets.ReservedBy).
type ReservedNameError struct{ Name, Target, Kind string }

func (e *ReservedNameError) Error() string {
	switch e.Kind {
	case schedule.KindChain:
		return fmt.Sprintf("name %q has the form of the fulls target %q's delta capture starts its chains from (%s-chain-YYYYMMDD-HHMMSS), which only the server may take", e.Name, e.Target, e.Target)
	case schedule.KindFold:
		return fmt.Sprintf("name %q has the form of target %q's folded delta chains (%s-fold-REVISION), which only the server may take", e.Name, e.Target, e.Target)
	}
	return fmt.Sprintf("name %q has the form of target %q's scheduled backups (%s-YYYYMMDD-HHMMSS), which only its schedule may take", e.Name, e.Target, e.Target)
}

// StorageError is a storage call that failed on behalf of work on backup
// Name ("" for the whole location) in location Location; Err wraps the
// storage's error (storage.ErrNotFound, storage.ErrAlreadyExists,
// storage.ErrNoSpace, *locations.UnavailableError, …).
type StorageError struct {
	Location string
	Name     string
	Err      error
}

func (e *StorageError) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("storage location %q: %v", e.Location, e.Err)
	}
	return fmt.Sprintf("backup %q in storage location %q: %v", e.Name, e.Location, e.Err)
}

func (e *StorageError) Unwrap() error { return e.Err }
