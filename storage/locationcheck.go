package storage

import (
	"context"
	"strings"
)

// What a location check (package storage/probe) needs of this layer: the
// names of its probe objects, which no backup can have, and what a store
// with features of its own (S3's multipart uploads, request checksums,
// conditional writes) lets it try.

// ProbePrefix starts the name of every object a location check writes:
// "_etcdbackup-check-" and a random suffix. No backup has such a name:
// backup names are DNS-1123 subdomains, which cannot hold '_', so no
// request can name a probe; and the server's locations (server/domain)
// leave probes out of every listing, so a probe an interrupted check
// left behind is never shown, retained or counted as a backup.
const ProbePrefix = "_etcdbackup-check-"

// IsProbe says whether name is a location check's probe.
func IsProbe(name string) bool { return strings.HasPrefix(name, ProbePrefix) }

// WithoutProbes is ms without the manifests of probes, in the same order;
// ms itself when it holds none.
func WithoutProbes(ms []*Manifest) []*Manifest {
	for i, m := range ms {
		if IsProbe(m.Name) {
			out := append([]*Manifest(nil), ms[:i]...)
			for _, m := range ms[i+1:] {
				if !IsProbe(m.Name) {
					out = append(out, m)
				}
			}
			return out
		}
	}
	return ms
}

// Prober is a Location whose store has features the Location calls do
// not show, which a location check tries. Each method works on objects
// of the probe called probe (a name IsProbe accepts), never a backup's.
type Prober interface {
	// ProbePartSize is the size of the parts an upload is cut into: an
	// upload of more bytes is a multipart upload.
	ProbePartSize() int64
	// ProbeChecksums tries the request checksums the location sends.
	ProbeChecksums(ctx context.Context, probe string) ProbeResult
	// ProbeConditionalWrite tries the create-only writes the location
	// relies on to keep two writers from publishing one name.
	ProbeConditionalWrite(ctx context.Context, probe string) ProbeResult
	// ProbeObjectLock tries the object lock the location asks for: a
	// probe written with a short retention in the configured mode, read
	// back, refused deletion while it lasts, removed after.
	ProbeObjectLock(ctx context.Context, probe string) ProbeResult
	// ProbeAdvice says what to do about err, which the Location call op
	// ("create", "write", "commit", "open", "read", "list", "delete")
	// returned during a check; "" when there is nothing particular to say.
	ProbeAdvice(op string, err error) string
}

// ProbeResult is the outcome of one of a Prober's own tries.
type ProbeResult struct {
	// Err is why it failed; nil when it passed or was skipped.
	Err error
	// Skipped says why it did not run (the location's configuration
	// turns the feature off); "" when it ran.
	Skipped string
	// Detail says what passed or what the configuration leaves out.
	Detail string
	// Advice is the setting that works around Err.
	Advice string
}

// Wrapper is a Location that wraps another: the server's locations are
// bounded (storage/locations) and counted (server/domain). As looks
// through it.
type Wrapper interface {
	// Unwrap is the location wrapped, nil if there is none yet. Calls
	// made on it bypass the wrapper: its bounds, its counting, its notice
	// of a store that stopped answering.
	Unwrap() Location
}

// As finds the first of l and the locations it wraps that is a T: an
// optional interface of a backend (Prober) through the wrappers the
// server puts around it.
func As[T any](l Location) (T, bool) {
	for l != nil {
		if t, ok := l.(T); ok {
			return t, true
		}
		w, ok := l.(Wrapper)
		if !ok {
			break
		}
		l = w.Unwrap()
	}
	var zero T
	return zero, false
}
