package domain

import "time"

// CopyStatus is what the copier (server/copies) knows of one object of
// a location that is not in one of its copy locations yet.
type CopyStatus struct {
	// Skipped: the copy location's ledger records the object deleted
	// there (a delete, or its retention): it is not copied again.
	Skipped bool
	// Failing is set after an attempt to copy it failed.
	Failing *CopyFailure
}

// CopyFailure is a copy that failed and is retried with backoff.
type CopyFailure struct {
	// Message says why the last attempt failed, for a person.
	Message string
	// Since is the first failed attempt, Next when the next one is due.
	Since, Next time.Time
	Attempts    int
}

// CopyTracker answers what the copier knows; the request layer asks it
// for backups it lists. Only the replica that runs the copier knows
// anything: a nil tracker, or one that knows nothing of an object, says
// the zero CopyStatus (pending).
type CopyTracker interface {
	CopyStatus(from, to, name, sha256 string) CopyStatus
}
