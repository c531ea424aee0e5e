package plugin

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// An in-cluster restore to a point: the server plans (full backup f1 and
// its two segments for revision 25), the plugin shows the plan, the Jobs
// carry it, and --wait says where the target was restored to.
func TestRestoreTargetToAPoint(t *testing.T) {
	w := newAgentWorld(t, "cp")
	loc, err := filesystem.New(w.srv.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	backuptest.Put(t, loc, &storage.Manifest{Name: "f1", CreateTime: t0,
		Source: storage.Source{Kind: ebv1.SourceAgent, Target: "app", StartTime: t0},
		Etcd:   &storage.EtcdInfo{Revision: 10, SnapshotStatus: true}}, []byte("full"))
	for i, first := range []int64{11, 21} {
		from := t0.Add(time.Duration(1+10*i) * time.Minute)
		backuptest.Put(t, loc, &storage.Manifest{Name: storage.SegmentName("f1", first), CreateTime: from, Compression: "zstd",
			Source: storage.Source{Kind: ebv1.SourceDelta, Target: "app"},
			Delta:  &storage.Delta{Chain: "f1", Epoch: 1, FirstRevision: first, LastRevision: first + 9, FirstTime: from, LastTime: from.Add(9 * time.Minute)}},
			[]byte("segment"))
	}

	r := mustRun(t, w.addr, "restore", "--target", "app", "--to-revision", "25", "--dry-run")
	if !strings.Contains(r.out, `would restore target "app" to revision 25: full backup "f1", then 2 delta segments replayed up to revision 25 (nothing was changed)`) {
		t.Fatalf("dry run:\n%s", r.out)
	}
	r = mustRun(t, w.addr, "restore", "--target", "app", "--to-time", "2026-03-01T10:05:00Z", "--dry-run", "-o", "jsonpath={.spec.backup} {.spec.toTime} {.spec.segments[*]}")
	if r.out != "f1 2026-03-01T10:05:00Z f1.delta-11" {
		t.Fatalf("dry run -o jsonpath = %q", r.out)
	}
	r = run(t, w.addr, "restore", "--target", "app", "--to-revision", "50", "--dry-run")
	if r.err == nil || !strings.Contains(r.err.Error(), "after the newest event stored") {
		t.Fatalf("restore to a revision past the chain: %v", r.err)
	}

	agent := make(chan []batchv1.Job)
	go func() {
		js := w.jobsOf(t, "app", "restore-agent", "f1", 2)
		for _, j := range js {
			w.finish(t, j, true, "")
		}
		agent <- js
	}()
	r = runRestoreAt(t, []time.Duration{0, 4200 * time.Millisecond}, w.addr, "restore", "--target", "app", "--to-revision", "25", "--allow-lease-loss", "--wait")
	js := <-agent
	if r.err != nil {
		t.Fatalf("restore --to-revision --wait: %v\n%s", r.err, r.errOut)
	}
	for _, j := range js {
		args := strings.Join(j.Spec.Template.Spec.Containers[0].Args, " ")
		if !strings.Contains(args, "--to-revision=25") || !strings.Contains(args, "--allow-lease-loss") || j.Annotations[jobs.AnnotationDeltaSegments] == "" {
			t.Errorf("job %s: args %s, segments %q", j.Name, args, j.Annotations[jobs.AnnotationDeltaSegments])
		}
	}
	if !strings.Contains(r.out, `target "app" restored to revision 25 (full backup "f1", 2 delta segments replayed)`) ||
		!strings.HasSuffix(r.out, "\ntarget \"app\" restored in 4.2s, from the command to every member's Job succeeded\n") {
		t.Fatalf("restore --wait output:\n%s", r.out)
	}
	if !strings.Contains(r.errOut, `restoring target "app" to revision 25: full backup "f1", then 2 delta segments`) {
		t.Errorf("progress on stderr:\n%s", r.errOut)
	}
}
