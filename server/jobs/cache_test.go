package jobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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
