package fetch

import (
	"errors"
	"fmt"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// ErrWrongBackup is returned when the backup stored under the name is not
// the one the fetch was pinned to (Request.SHA256).
var ErrWrongBackup = errors.New("the backup stored under this name is not the one this restore was started for")

// ErrChanged is returned when the backup stored under the name is not the
// one the caller looked up (Request.Record): it was replaced meanwhile.
var ErrChanged = errors.New("the backup changed on the server since it was looked up")

// Kind says which step of a fetch failed; each has its own remedy.
type Kind int

const (
	// WrongBackup: the stored SHA-256 is not the pinned one.
	WrongBackup Kind = iota + 1
	// Changed: the stored SHA-256 is not the looked-up record's.
	Changed
	// Identity: the backup is encrypted and no identity given decrypts it
	// (Err is crypt.ErrIdentityRequired or crypt.ErrNoMatchingIdentity).
	Identity
	// StoredCorrupt: the stored bytes do not hash to the stored SHA-256
	// (Err wraps client.ErrCorrupt): storage or transfer, not the content.
	StoredCorrupt
	// Corrupt: the stored bytes are what was stored, but not a whole etcd
	// snapshot as recorded (Err wraps snapshot.ErrCorrupt): age's
	// authentication, decompression, its bound, etcd's trailer, the plain
	// size and SHA-256, bolt's check.
	Corrupt
	// Download: the server or the connection to it failed; Err carries
	// the API's status.
	Download
	// Local: writing on this side failed (the work directory, the output).
	Local
)

// Error is a fetch that failed. Its message is the one a restore reports
// (the agent's log, `restore --local`, drill and fold verdicts); a caller
// with other remedies to offer (download's `kubectl etcdbackup verify`)
// words it from Kind and Err.
type Error struct {
	Kind Kind
	// Name is the backup's or the delta segment's.
	Name string
	// Segment is set for a delta segment.
	Segment bool
	// Err is what failed underneath.
	Err error
}

func (e *Error) Error() string {
	what := fmt.Sprintf("backup %q", e.Name)
	if e.Segment {
		what = fmt.Sprintf("delta segment %q", e.Name)
	}
	switch e.Kind {
	case WrongBackup:
		// Neither hash is named: the error reaches the agent's log and its
		// Job's status.
		if e.Segment {
			return fmt.Sprintf("%s: %v: its SHA-256 differs (it was replaced under the same name?); nothing was restored, plan the restore again", what, ErrWrongBackup)
		}
		return fmt.Sprintf("%s: %v: its SHA-256 differs (it was replaced under the same name?); nothing was restored, start the restore again if the new content is what you want", what, ErrWrongBackup)
	case Changed:
		return fmt.Sprintf("%s changed on the server since it was looked up; download it again", what)
	case StoredCorrupt:
		return fmt.Sprintf("%s is corrupt, refusing to restore it: %v: %v", what, snapshot.ErrCorrupt, e.Err)
	case Corrupt:
		if e.Segment {
			// A segment's own checks name the segment's fault.
			return fmt.Sprintf("%s: %v", what, e.Err)
		}
		return fmt.Sprintf("%s is corrupt, refusing to restore it: %v", what, e.Err)
	case Download:
		if e.Segment {
			return fmt.Sprintf("%s: %v", what, e.Err)
		}
		return e.Err.Error()
	}
	return fmt.Sprintf("%s: %v", what, e.Err)
}

// Unwrap lets errors.Is see the kind's sentinel (ErrWrongBackup,
// ErrChanged, snapshot.ErrCorrupt for both corrupt kinds) and the error
// underneath.
func (e *Error) Unwrap() []error {
	switch e.Kind {
	case WrongBackup:
		return []error{ErrWrongBackup}
	case Changed:
		return []error{ErrChanged}
	case StoredCorrupt:
		return []error{snapshot.ErrCorrupt, e.Err}
	}
	return []error{e.Err}
}

// KindOf is the kind of a fetch's error, 0 when err is none.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}
