package jobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

func finish(t *testing.T, cs *fake.Clientset, job *batchv1.Job) {
	t.Helper()
	job.Status.Succeeded = 1
	job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	if _, err := cs.BatchV1().Jobs(job.Namespace).UpdateStatus(context.Background(), job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func runNames(t *testing.T, l *jobs.Launcher) map[string]jobs.Run {
	t.Helper()
	runs, err := l.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]jobs.Run{}
	for _, r := range runs {
		out[r.Name] = r
	}
	return out
}

// The Launcher's own writes are in its next read, without waiting: the
// scheduler's next round sees the Job it started, a delete the restore
// StartRestore started.
func TestReadsSeeOwnWrites(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	ctx := context.Background()
	for i, name := range []string{"b1", "b2", "b3"} {
		if _, err := l.StartBackup(ctx, jobs.BackupSpec{Name: name, Location: "default", Target: target}); err != nil {
			t.Fatal(err)
		}
		if runs := runNames(t, l); len(runs) != i+1 || runs[name].Phase != jobs.PhaseRunning {
			t.Fatalf("after starting %s: %+v", name, runs)
		}
	}
	if err := l.MarkCounted(ctx, runNames(t, l)["b2"].JobName); err != nil {
		t.Fatal(err)
	}
	if r := runNames(t, l)["b2"]; !r.Counted {
		t.Fatalf("after MarkCounted: %+v", r)
	}
	created, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b1", Location: "default", Target: restoreTarget})
	if err != nil {
		t.Fatal(err)
	}
	running, err := l.RunningRestores(ctx, "default", "b1", restoreTargets)
	if err != nil || len(running) != 1 || running[0] != created[0].Namespace+"/"+created[0].Name {
		t.Fatalf("running restores right after StartRestore: %v, %v", running, err)
	}
}

// A backup removed from storage does not come back from its Job: a
// finished Job, succeeded or failed, is deleted; a running one is left
// running, and left out of List once it has finished. A new backup of
// the same name is listed again.
func TestForgetBackup(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	start := func(name string) *batchv1.Job {
		t.Helper()
		j, err := l.StartBackup(ctx, jobs.BackupSpec{Name: name, Location: "default", Target: target})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	done, failed, running := start("done"), start("failed"), start("running")
	finish(t, cs, done)
	setFailed(t, cs, failed)
	running.Status.Active = 1
	if _, err := cs.BatchV1().Jobs(ns).UpdateStatus(ctx, running, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	synced(t, l)
	if runs := runNames(t, l); len(runs) != 3 {
		t.Fatalf("runs %+v", runs)
	}

	for _, name := range []string{"done", "failed", "running"} {
		if err := l.ForgetBackup(ctx, "default", name); err != nil {
			t.Fatalf("forget %s: %v", name, err)
		}
	}
	runs := runNames(t, l)
	if _, ok := runs["done"]; ok {
		t.Errorf("the finished Job of a forgotten backup is listed: %+v", runs["done"])
	}
	if _, ok := runs["failed"]; ok {
		t.Errorf("the failed Job of a forgotten backup is listed: %+v", runs["failed"])
	}
	if r := runs["running"]; r.Phase != jobs.PhaseRunning {
		t.Errorf("the running agent of a forgotten backup: %+v, want it listed Running", r)
	}
	for _, j := range []*batchv1.Job{done, failed} {
		if _, err := cs.BatchV1().Jobs(ns).Get(ctx, j.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("job %s of a forgotten backup: %v, want it deleted", j.Name, err)
		}
	}
	still, err := cs.BatchV1().Jobs(ns).Get(ctx, running.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the running agent's Job was deleted: %v", err)
	}
	if still.DeletionTimestamp != nil || still.Status.Active != 1 || still.Annotations[jobs.AnnotationForgotten] != "true" {
		t.Errorf("running Job: deletion %v, active %d, annotations %v", still.DeletionTimestamp, still.Status.Active, still.Annotations)
	}

	// The agent had stored the backup just before it was removed, and
	// now ends: its Job stays out of the listing.
	finish(t, cs, still)
	synced(t, l)
	if r, ok := runNames(t, l)["running"]; ok {
		t.Errorf("the forgotten backup came back from its finished Job: %+v", r)
	}
	if _, err := cs.BatchV1().Jobs(ns).Get(ctx, running.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the Job of the forgotten run is gone (its log too): %v", err)
	}

	// A new backup of a forgotten name is a new run.
	start("done")
	if r := runNames(t, l)["done"]; r.Phase != jobs.PhaseRunning {
		t.Errorf("new backup of a forgotten name: %+v", r)
	}

	// Nothing to forget: not even a request.
	cs.ClearActions()
	if err := l.ForgetBackup(ctx, "default", "never-ran"); err != nil {
		t.Fatal(err)
	}
	if a := cs.Actions(); len(a) != 0 {
		t.Errorf("forgetting a backup without a Job made requests: %v", a)
	}
}

// Events are cached for agent Jobs and pods only: the namespace's other
// events are dropped before the store.
func TestOnlyAgentEventsAreCached(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	job, err := l.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range []corev1.ObjectReference{
		{Kind: "Job", Name: job.Name},
		{Kind: "Pod", Name: job.Name + "-7xq2k"},
		{Kind: "Pod", Name: "etcd-0"},
		{Kind: "Job", Name: "nightly-report"},
		{Kind: "Deployment", Name: job.Name},
		{Kind: "Pod", Name: "etcdbackup-server-5d8f7c9b4-abcde"},
	} {
		e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e" + string(rune('0'+i))}, InvolvedObject: o, Reason: "Test"}
		if _, err := cs.CoreV1().Events(ns).Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	synced(t, l)
	if n := l.CachedEvents(ns); n != 2 {
		t.Errorf("%d events cached, want the 2 about the agent's Job and pod", n)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job.Name + "-7xq2k", Labels: podLabels(job)}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	synced(t, l)
	_, events, err := l.Events(ctx, "default", "b1")
	if err != nil || len(events) != 2 {
		t.Fatalf("events of b1: %v, %v", events, err)
	}
}

// Reads need Start. A restore namespace the server may not watch does
// not hold Start up: reads there fail, saying so, while the server's own
// namespace serves. The server's own namespace must be watchable.
func TestStartAndUnwatchableNamespaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cs := fake.NewClientset()
	l, err := jobs.New(cs, ns, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.List(ctx); err == nil || !strings.Contains(err.Error(), "Start") {
		t.Errorf("List before Start: %v", err)
	}
	forbid := func(namespace string) k8stesting.ReactionFunc {
		return func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetNamespace() != namespace {
				return false, nil, nil
			}
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "batch", Resource: "jobs"}, "", errors.New("no Role here"))
		}
	}
	cs.PrependReactor("list", "jobs", forbid("app"))
	if err := l.Start(ctx, restoreTargets); err != nil {
		t.Fatalf("Start with a forbidden restore namespace: %v", err)
	}
	if _, err := l.List(ctx); err != nil {
		t.Errorf("List in the server's namespace: %v", err)
	}
	_, err = l.ListRestores(ctx, "default", "b1", restoreTarget)
	if err == nil || !strings.Contains(err.Error(), "namespace app are not readable yet") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("ListRestores in the forbidden namespace: %v", err)
	}
	if _, err := l.RunningRestores(ctx, "default", "b1", restoreTargets); err == nil {
		t.Error("RunningRestores with a forbidden namespace: no error (a backup being restored there could be deleted)")
	}
	other := restoreTarget
	other.Namespace = "elsewhere"
	if _, err := l.ListRestores(ctx, "default", "b1", other); err == nil || !strings.Contains(err.Error(), "not watched") {
		t.Errorf("ListRestores in a namespace Start was not given: %v", err)
	}
	if err := l.Start(ctx, nil); err == nil {
		t.Error("a second Start: no error")
	}

	own := fake.NewClientset()
	own.PrependReactor("list", "jobs", forbid(ns))
	l, err = jobs.New(own, ns, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(ctx, nil); err == nil || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "namespace "+ns) {
		t.Errorf("Start with the server's namespace forbidden: %v", err)
	}
}
