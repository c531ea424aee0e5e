package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// A restore to a point carries the point and its segment list in
// annotations the signature covers; the pod reads the list as a file and
// the agent checks it against a digest in its args. Editing the point or
// the list breaks the signature.
func TestRestoreToAPointJobCarriesAndSignsSegments(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	segs := []jobs.SegmentPin{{Name: "b1.delta-11", SHA256: strings.Repeat("b", 64)}, {Name: "b1.delta-21", SHA256: strings.Repeat("c", 64)}}
	rs, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b1", Location: "default", Target: restoreTarget, SHA256: strings.Repeat("a", 64),
		ToRevision: 25, Segments: segs, AllowLeaseLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	j, err := cs.BatchV1().Jobs(rs[0].Namespace).Get(ctx, rs[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := jobs.DecodeSegments(j.Annotations[jobs.AnnotationDeltaSegments])
	if err != nil || !slices.Equal(got, segs) {
		t.Fatalf("segments annotation %q: %v, %v; want %v", j.Annotations[jobs.AnnotationDeltaSegments], got, err, segs)
	}
	if j.Spec.Template.Annotations[jobs.AnnotationDeltaSegments] != j.Annotations[jobs.AnnotationDeltaSegments] {
		t.Error("the pod template does not carry the segment list its downward API volume reads")
	}
	if j.Annotations[jobs.AnnotationToRevision] != "25" {
		t.Errorf("to-revision annotation %q", j.Annotations[jobs.AnnotationToRevision])
	}
	args := strings.Join(j.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--to-revision=25", "--segments-file=/etc/etcdbackup/delta-segments/segments.json", "--segments-sha256=", "--allow-lease-loss"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %s lack %s", args, want)
		}
	}
	var downward bool
	for _, v := range j.Spec.Template.Spec.Volumes {
		if d := v.DownwardAPI; d != nil && len(d.Items) == 1 && strings.Contains(d.Items[0].FieldRef.FieldPath, jobs.AnnotationDeltaSegments) {
			downward = true
		}
	}
	if !downward {
		t.Error("no downward API volume shows the segment list")
	}
	c := jobs.ClaimsOf(j)
	if c.ToRevision != "25" || c.Segments == "" {
		t.Errorf("claims %+v: the point and the segments are not claimed", c)
	}
	if !l.Signed(j) {
		t.Fatal("the restore to a point Job is not signed")
	}
	for _, edit := range []struct{ key, value string }{
		{jobs.AnnotationToRevision, "30"},
		{jobs.AnnotationDeltaSegments, `[{"name":"b1.delta-11","sha256":"` + strings.Repeat("b", 64) + `"}]`},
		{jobs.AnnotationToTime, "2026-01-01T00:00:00Z"},
	} {
		e := j.DeepCopy()
		e.Annotations[edit.key] = edit.value
		if l.Signed(e) {
			t.Errorf("a Job whose %s was edited to %q still passes as signed", edit.key, edit.value)
		}
	}
	e := j.DeepCopy()
	delete(e.Annotations, jobs.AnnotationDeltaSegments)
	delete(e.Annotations, jobs.AnnotationToRevision)
	if l.Signed(e) {
		t.Error("a Job stripped of its point passes as signed: it would restore the full backup as it is")
	}
}

// A to-time Job says its time; a plain restore says no point at all, so
// its claims and signature are what they were before points existed.
func TestRestoreJobPointAnnotations(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	ctx := context.Background()
	at := time.Date(2026, 12, 2, 14, 5, 0, 0, time.FixedZone("CET", 3600))
	rs, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b1", Location: "default", Target: restoreTarget, SHA256: strings.Repeat("a", 64), ToTime: at})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(rs[0].Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--to-time=2026-12-02T13:05:00Z") || rs[0].Annotations[jobs.AnnotationDeltaSegments] != "[]" {
		t.Errorf("to-time Job: args %s, segments %q", args, rs[0].Annotations[jobs.AnnotationDeltaSegments])
	}
	plain, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b2", Location: "default", Target: restoreTarget, SHA256: strings.Repeat("a", 64)})
	if err != nil {
		t.Fatal(err)
	}
	if c := jobs.ClaimsOf(plain[0]); c.ToRevision != "" || c.ToTime != "" || c.Segments != "" {
		t.Errorf("a plain restore claims a point: %+v", c)
	}
	if strings.Contains(strings.Join(plain[0].Spec.Template.Spec.Containers[0].Args, " "), "--segments") {
		t.Error("a plain restore Job reads a segment list")
	}
}

// A list too long for an annotation is refused before anything is made.
func TestRestoreJobRefusesTooManySegments(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	var segs []jobs.SegmentPin
	for i := range 3000 {
		segs = append(segs, jobs.SegmentPin{Name: fmt.Sprintf("b1.delta-%d", i*10+1), SHA256: strings.Repeat("b", 64)})
	}
	_, err := l.StartRestore(context.Background(), jobs.RestoreSpec{Name: "b1", Location: "default", Target: restoreTarget, SHA256: strings.Repeat("a", 64), ToRevision: 5, Segments: segs})
	if !errors.Is(err, jobs.ErrTooManySegments) {
		t.Fatalf("StartRestore of %d segments: %v, want ErrTooManySegments", len(segs), err)
	}
}
