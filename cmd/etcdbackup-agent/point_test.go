package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
)

// The agent reads the segment list as the server's Job writes it
// (jobs.EncodeSegments) and only with the digest its args carry.
func TestRestorePointFlags(t *testing.T) {
	list := `[{"name":"f1.delta-11","sha256":"` + strings.Repeat("b", 64) + `"},{"name":"f1.delta-21","sha256":"` + strings.Repeat("c", 64) + `"}]`
	file := filepath.Join(t.TempDir(), "segments.json")
	if err := os.WriteFile(file, []byte(list), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(list))
	digest := hex.EncodeToString(sum[:])

	d, err := restoreDeltas(agentjob.RestoreFlags{ToRevision: 25, SegmentsFile: file, SegmentsSHA256: digest, AllowLeaseLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Point.Revision != 25 || !d.AllowLeaseLoss || len(d.Segments) != 2 ||
		d.Segments[1] != (fetch.Pin{Name: "f1.delta-21", SHA256: strings.Repeat("c", 64)}) {
		t.Fatalf("deltas %+v", d)
	}
	d, err = restoreDeltas(agentjob.RestoreFlags{ToTime: "2026-03-01T10:05:00Z", SegmentsFile: file, SegmentsSHA256: digest})
	if err != nil || d.Point.Time.IsZero() || d.Point.Revision != 0 {
		t.Fatalf("to-time: %+v, %v", d, err)
	}
	if d, err := restoreDeltas(agentjob.RestoreFlags{}); d != nil || err != nil {
		t.Fatalf("no point: %+v, %v; want a plain restore", d, err)
	}
	for _, c := range []struct {
		f    agentjob.RestoreFlags
		want string
	}{
		{agentjob.RestoreFlags{ToRevision: 25, SegmentsFile: file, SegmentsSHA256: strings.Repeat("0", 64)}, "not the segment list this Job was started with"},
		{agentjob.RestoreFlags{ToRevision: 25}, "needs --segments-file"},
		{agentjob.RestoreFlags{ToRevision: 25, ToTime: "2026-03-01T10:05:00Z", SegmentsFile: file, SegmentsSHA256: digest}, "not both"},
		{agentjob.RestoreFlags{ToTime: "yesterday", SegmentsFile: file, SegmentsSHA256: digest}, "RFC 3339"},
		{agentjob.RestoreFlags{AllowLeaseLoss: true}, "go with --to-revision"},
	} {
		if _, err := restoreDeltas(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want an error saying %q", c.f, err, c.want)
		}
	}
}
