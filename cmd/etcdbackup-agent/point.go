package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
)

// pointFlags are a restore to a point's: where replay stops, and the
// delta segments to replay, listed in a file (the server's Job shows its
// annotation there through the downward API: a long chain does not fit
// in args) whose SHA-256 is given in args.
type pointFlags struct {
	toRevision     int64
	toTime         string
	toMinRevision  int64
	segmentsFile   string
	segmentsSHA256 string
	allowLeaseLoss bool
}

// deltas are the restore's Deltas, nil for a restore of the backup as it
// is.
func (f pointFlags) deltas() (*member.Deltas, error) {
	p := delta.Point{Revision: f.toRevision, MinRevision: f.toMinRevision}
	if f.toTime != "" {
		t, err := time.Parse(time.RFC3339Nano, f.toTime)
		if err != nil {
			return nil, fmt.Errorf("--to-time %q is not an RFC 3339 time", f.toTime)
		}
		p.Time = t
	}
	switch {
	case p.Revision < 0:
		return nil, fmt.Errorf("--to-revision %d: etcd revisions are positive", p.Revision)
	case p.Revision > 0 && !p.Time.IsZero():
		return nil, errors.New("give --to-revision or --to-time, not both")
	case p.MinRevision < 0 || (p.MinRevision > 0 && p.Time.IsZero()):
		return nil, fmt.Errorf("--to-min-revision %d goes with --to-time and is positive", p.MinRevision)
	case p.Revision == 0 && p.Time.IsZero():
		if f.segmentsFile != "" || f.allowLeaseLoss {
			return nil, errors.New("--segments-file and --allow-lease-loss go with --to-revision or --to-time")
		}
		return nil, nil
	case f.segmentsFile == "" || f.segmentsSHA256 == "":
		return nil, errors.New("a restore to a point needs --segments-file and --segments-sha256 (the server's restore Job sets both)")
	}
	b, err := os.ReadFile(f.segmentsFile)
	if err != nil {
		return nil, fmt.Errorf("--segments-file: %w", err)
	}
	// The file shows an annotation of the pod, which can be edited after
	// the Job was made; the digest in args cannot.
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != f.segmentsSHA256 {
		return nil, fmt.Errorf("--segments-file %s is not the segment list this Job was started with (its SHA-256 differs from --segments-sha256; the pod's annotation was edited?); nothing was restored, start the restore again", f.segmentsFile)
	}
	var segs []fetch.Pin
	if err := json.Unmarshal(b, &segs); err != nil {
		return nil, fmt.Errorf("--segments-file %s: %w", f.segmentsFile, err)
	}
	return &member.Deltas{Segments: segs, Point: p, AllowLeaseLoss: f.allowLeaseLoss}, nil
}
