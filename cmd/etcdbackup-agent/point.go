package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
)

// restoreDeltas are the Deltas of a restore to a point, nil for a
// restore of the backup as it is: where replay stops, and the delta
// segments to replay, listed in a file (the server's Job shows its
// annotation there through the downward API: a long chain does not fit
// in args) whose SHA-256 is given in args.
func restoreDeltas(f agentjob.RestoreFlags) (*member.Deltas, error) {
	p := delta.Point{Revision: f.ToRevision, MinRevision: f.ToMinRevision}
	if f.ToTime != "" {
		t, err := time.Parse(time.RFC3339Nano, f.ToTime)
		if err != nil {
			return nil, fmt.Errorf("--to-time %q is not an RFC 3339 time", f.ToTime)
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
		if f.SegmentsFile != "" || f.AllowLeaseLoss {
			return nil, errors.New("--segments-file and --allow-lease-loss go with --to-revision or --to-time")
		}
		return nil, nil
	case f.SegmentsFile == "" || f.SegmentsSHA256 == "":
		return nil, errors.New("a restore to a point needs --segments-file and --segments-sha256 (the server's restore Job sets both)")
	}
	b, err := os.ReadFile(f.SegmentsFile)
	if err != nil {
		return nil, fmt.Errorf("--segments-file: %w", err)
	}
	// The file shows an annotation of the pod, which can be edited after
	// the Job was made; the digest in args cannot.
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != f.SegmentsSHA256 {
		return nil, fmt.Errorf("--segments-file %s is not the segment list this Job was started with (its SHA-256 differs from --segments-sha256; the pod's annotation was edited?); nothing was restored, start the restore again", f.SegmentsFile)
	}
	var segs []fetch.Pin
	if err := json.Unmarshal(b, &segs); err != nil {
		return nil, fmt.Errorf("--segments-file %s: %w", f.SegmentsFile, err)
	}
	return &member.Deltas{Segments: segs, Point: p, AllowLeaseLoss: f.AllowLeaseLoss}, nil
}
