package jobs_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// FuzzParseFoldInputs reads arbitrary text as a fold Job's inputs
// annotation (the agent reads it from a downward-API file, the server
// from the Job): it never panics, and what it accepts pins a full and
// 1..MaxFoldSegments segments, each to a SHA-256, up to a positive
// revision, and encodes back to inputs that parse the same.
func FuzzParseFoldInputs(f *testing.F) {
	sha := strings.Repeat("ab", 32)
	for _, in := range []jobs.FoldInputs{
		{Full: jobs.FoldRef{Name: "cp-20260101-0000", SHA256: sha}, Segments: []jobs.FoldRef{{Name: "cp-20260101-0000.delta-1", SHA256: sha}}, ToRevision: 120},
		{Full: jobs.FoldRef{Name: "f", SHA256: sha}, Segments: []jobs.FoldRef{{Name: "s1", SHA256: sha}, {Name: "s2", SHA256: sha}, {Name: "s3", SHA256: sha}}, ToRevision: 1 << 62},
	} {
		b, err := json.Marshal(in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	for _, s := range []string{``, `{}`, `null`, `[]`, `{"full":{"name":"f","sha256":"x"},"segments":[],"toRevision":1}`,
		`{"full":{"name":"f","sha256":"x"},"segments":[{"name":"s","sha256":""}],"toRevision":1}`,
		`{"full":{"name":"f","sha256":"x"},"segments":[{"name":"s","sha256":"y"}],"toRevision":-1}`,
		`{"full":{"name":"f","sha256":"x"},"segments":[{"name":"s","sha256":"y"}],"toRevision":1,"extra":true}`,
		`{"full":{"name":"f","sha256":"x"},"segments":[{"name":"s","sha256":"y"}],"toRevision":1e400}`,
		`{"full":{"name":"\ud800","sha256":"x"},"segments":[{"name":"s","sha256":"y"}],"toRevision":1} trailing`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		in, err := jobs.ParseFoldInputs(s)
		if err != nil {
			if !strings.Contains(err.Error(), jobs.AnnotationFoldInputs) {
				t.Fatalf("an error that does not name the annotation: %v", err)
			}
			return
		}
		if in.Full.Name == "" || in.Full.SHA256 == "" || len(in.Segments) == 0 || len(in.Segments) > jobs.MaxFoldSegments || in.ToRevision <= 0 ||
			slices.ContainsFunc(in.Segments, func(r jobs.FoldRef) bool { return r.Name == "" || r.SHA256 == "" }) {
			t.Fatalf("accepted %+v", in)
		}
		pins := in.Pins()
		for _, r := range append([]jobs.FoldRef{in.Full}, in.Segments...) {
			if _, ok := pins[r.Name]; !ok {
				t.Fatalf("Pins %v leave out %q", pins, r.Name)
			}
		}
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		again, err := jobs.ParseFoldInputs(string(b))
		if err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("encoded again, %s parses as %+v (%v), not %+v", b, again, err, in)
		}
	})
}

// FuzzDecodeSegments reads arbitrary text as a restore Job's segment
// list annotation: it never panics, what it accepts names and pins
// every segment, and EncodeSegments writes it back to a list that
// decodes the same (or refuses it as too long for an annotation).
func FuzzDecodeSegments(f *testing.F) {
	sha := strings.Repeat("cd", 32)
	for _, segs := range [][]jobs.SegmentPin{nil, {{Name: "cp.delta-1", SHA256: sha}}, {{Name: "a", SHA256: sha}, {Name: "b", SHA256: sha}}} {
		s, err := jobs.EncodeSegments(segs)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s)
	}
	for _, s := range []string{``, `null`, `{}`, `[{}]`, `[{"name":"a"}]`, `[{"name":"a","sha256":"x","extra":1}]`, `[null]`, `[{"name":1,"sha256":"x"}]`, `["a"]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		segs, err := jobs.DecodeSegments(s)
		if err != nil {
			if !strings.Contains(err.Error(), jobs.AnnotationDeltaSegments) {
				t.Fatalf("an error that does not name the annotation: %v", err)
			}
			return
		}
		if slices.ContainsFunc(segs, func(p jobs.SegmentPin) bool { return p.Name == "" || p.SHA256 == "" }) {
			t.Fatalf("accepted %+v", segs)
		}
		enc, err := jobs.EncodeSegments(segs)
		if errors.Is(err, jobs.ErrTooManySegments) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		again, err := jobs.DecodeSegments(enc)
		if err != nil || !slices.Equal(again, segs) {
			t.Fatalf("encoded again, %s decodes as %+v (%v), not %+v", enc, again, err, segs)
		}
	})
}
