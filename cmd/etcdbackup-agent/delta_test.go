package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// testElection is a fast election on the delta Lease of target "t": as
// fast as the server lets one pod call its Lease (2 calls a second).
func testElection(id string) election {
	return election{name: "of target t", identity: id,
		leaseDuration: 4 * time.Second, renewDeadline: 2 * time.Second, retryPeriod: time.Second}
}

// testLease is target t's delta Lease in namespace etcdbackup.
var testLease = jobs.DeltaLeaseName("t")

// expiredLease was held by a dead agent, 4 transitions ago.
func expiredLease() *coordinationv1.Lease {
	old := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "etcdbackup", Name: testLease, ResourceVersion: "1"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("dead_0000"), LeaseDurationSeconds: ptr.To[int32](1),
			AcquireTime: &old, RenewTime: &old, LeaseTransitions: ptr.To[int32](4)},
	}
}

// conditionalLeaseUpdates makes the fake's Lease updates conditional on
// the resourceVersion read, as the API server's are (the fake's tracker
// stores whatever it is given): without that, a deposed agent's renewal
// would silently overwrite the new holder. Install before the elector
// runs: reactors are not safe to add while it calls.
func conditionalLeaseUpdates(kube *fake.Clientset) {
	var version atomic.Int64
	version.Store(1)
	kube.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		stored, err := kube.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		if l.ResourceVersion != stored.(*coordinationv1.Lease).ResourceVersion {
			return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), l.Name, errors.New("the object has been modified"))
		}
		// The default reaction stores this object, with its next version.
		l.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
		return false, nil, nil
	})
}

// holder is who holds the Lease; callable from any goroutine.
func holder(t *testing.T, kube kubernetes.Interface) string {
	t.Helper()
	l, err := kube.CoordinationV1().Leases("etcdbackup").Get(context.Background(), testLease, metav1.GetOptions{})
	if err != nil {
		t.Error(err)
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

type electedRun struct {
	done chan struct{}
	res  delta.Result
	err  error
}

// startElected runs the agent el as it runs in its pod: its elector holds
// the Lease through a data server's agent port (delta.ServerLock), which
// writes it in kube as the delta agent of target t in pod POD (el's
// identity is POD_RANDOM).
func startElected(ctx context.Context, t *testing.T, kube kubernetes.Interface, el election, capture captureFunc) *electedRun {
	t.Helper()
	launcher, err := jobs.New(kube, "etcdbackup", config.Agents{Image: "agent:test"})
	if err != nil {
		t.Fatal(err)
	}
	pod, _, _ := strings.Cut(el.identity, "_")
	srv := servertest.StartWith(t, servertest.Options{Agents: launcher,
		AgentGuard: servertest.AsAgent{Kind: agentjob.Delta, Target: "t", Pod: pod, JobNamespace: "etcdbackup", JobName: "delta-t"}})
	lock := delta.NewServerLock(srv.AgentClient.Agents, el.name, el.identity)
	r := &electedRun{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.res, r.err = runElected(ctx, lock, el, slog.New(slog.DiscardHandler), capture)
	}()
	return r
}

// started waits until capture began (it closes started), failing the
// test if runElected returned first or nothing happens for 30 s.
func (r *electedRun) started(t *testing.T, started <-chan struct{}) {
	t.Helper()
	select {
	case <-started:
	case <-r.done:
		t.Fatalf("runElected returned before capture began: %+v, %v", r.res, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("capture did not begin: the agent never led")
	}
}

func (r *electedRun) wait(t *testing.T) (delta.Result, error) {
	t.Helper()
	select {
	case <-r.done:
		return r.res, r.err
	case <-time.After(30 * time.Second):
		t.Fatal("runElected did not return")
		return delta.Result{}, nil
	}
}

// The agent captures once it took the Lease over, at the epoch the
// takeover made (transitions + 1); when the chain ends it releases the
// Lease.
func TestElectedCaptureAtEpoch(t *testing.T) {
	kube := fake.NewClientset(expiredLease())
	conditionalLeaseUpdates(kube)
	el := testElection("pod-a_01")
	var epoch int64
	r := startElected(context.Background(), t, kube, el, func(ctx context.Context, e int64) (delta.Result, error) {
		epoch = e
		if h := holder(t, kube); h != el.identity {
			t.Errorf("capturing while %q holds the Lease", h)
		}
		return delta.Result{ChainEnded: "etcd compacted"}, nil
	})
	res, err := r.wait(t)
	if err != nil || res.ChainEnded != "etcd compacted" {
		t.Fatalf("runElected: %+v, %v", res, err)
	}
	if epoch != 5 {
		t.Fatalf("epoch %d, want 5 (the Lease's transitions after the takeover)", epoch)
	}
	if h := holder(t, kube); h != "" {
		t.Fatalf("Lease still held by %q after the chain ended", h)
	}
}

// SIGTERM stops capture, which stores what it holds while the Lease is
// still this agent's; only then is the Lease released.
func TestElectedStopStoresUnderLease(t *testing.T) {
	kube := fake.NewClientset(expiredLease())
	conditionalLeaseUpdates(kube)
	el := testElection("pod-a_02")
	ctx, stop := context.WithCancel(context.Background())
	started := make(chan struct{})
	r := startElected(ctx, t, kube, el, func(ctx context.Context, _ int64) (delta.Result, error) {
		close(started)
		<-ctx.Done()
		if errors.Is(context.Cause(ctx), delta.ErrNotLeader) {
			return delta.Result{}, delta.ErrNotLeader
		}
		// The flush.
		if h := holder(t, kube); h != el.identity {
			t.Errorf("storing pending revisions while %q holds the Lease", h)
		}
		return delta.Result{Segments: 1}, nil
	})
	r.started(t, started)
	stop()
	res, err := r.wait(t)
	if err != nil || res.Segments != 1 {
		t.Fatalf("runElected: %+v, %v", res, err)
	}
	if h := holder(t, kube); h != "" {
		t.Fatalf("Lease still held by %q after the agent stopped", h)
	}
}

// An agent whose Lease another took stops capture at once, told that it
// is not the leader, and fails saying so.
func TestElectedLostLease(t *testing.T) {
	kube := fake.NewClientset(expiredLease())
	conditionalLeaseUpdates(kube)
	el := testElection("pod-a_03")
	started := make(chan struct{})
	r := startElected(context.Background(), t, kube, el, func(ctx context.Context, _ int64) (delta.Result, error) {
		close(started)
		<-ctx.Done()
		return delta.Result{}, context.Cause(ctx)
	})
	r.started(t, started)
	// Another agent takes the Lease over as one would after this agent's
	// renewals stopped reaching the API server: its update is conditional
	// on the version it read, so a renewal in between makes it read again.
	leases := kube.CoordinationV1().Leases("etcdbackup")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(context.Background(), testLease, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.NewMicroTime(time.Now().Add(time.Hour))
		l.Spec.HolderIdentity, l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = ptr.To("pod-b_04"), &now, ptr.To[int32](3600)
		l.Spec.LeaseTransitions = ptr.To(*l.Spec.LeaseTransitions + 1)
		_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.wait(t)
	if !errors.Is(err, delta.ErrNotLeader) || !strings.Contains(err.Error(), "lost the delta Lease of target t") {
		t.Fatalf("runElected: %v", err)
	}
	if h := holder(t, kube); h != "pod-b_04" {
		t.Fatalf("the deposed agent changed the Lease: held by %q", h)
	}
}

// An agent stopped before it led stops at once.
func TestElectedStopWhileWaiting(t *testing.T) {
	held := expiredLease()
	now := metav1.NewMicroTime(time.Now().Add(time.Hour))
	held.Spec.RenewTime, held.Spec.HolderIdentity, held.Spec.LeaseDurationSeconds = &now, ptr.To("pod-b_05"), ptr.To[int32](3600)
	kube := fake.NewClientset(held)
	conditionalLeaseUpdates(kube)
	ctx, stop := context.WithCancel(context.Background())
	r := startElected(ctx, t, kube, testElection("pod-a_06"), func(ctx context.Context, _ int64) (delta.Result, error) {
		t.Error("captured without the Lease")
		return delta.Result{}, nil
	})
	stop()
	if res, err := r.wait(t); err != nil || res.Segments != 0 {
		t.Fatalf("runElected: %+v, %v", res, err)
	}
	if h := holder(t, kube); h != "pod-b_05" {
		t.Fatalf("Lease held by %q", h)
	}
}

// The chain's end goes to the termination message as JSON, cut to fit.
func TestWriteDeltaEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "termination-log")
	if err := writeReport(path, agentjob.DeltaEnd{ChainEnded: strings.Repeat("r", 5000)}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var end agentjob.DeltaEnd
	if err := json.Unmarshal(b, &end); err != nil || len(b) > 4096 || !strings.HasPrefix(end.ChainEnded, "rrr") {
		t.Fatalf("termination message %d bytes: %v", len(b), err)
	}
}

// The subcommand refuses to start without its chain and target, naming
// those missing.
func TestDeltaRequiredFlags(t *testing.T) {
	root := newRoot()
	root.SetArgs([]string{"delta", "--server=127.0.0.1:1", "--target=t"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--chain is required") {
		t.Fatalf("delta without --chain: %v", err)
	}
	root = newRoot()
	root.SetArgs([]string{"delta", "--server=127.0.0.1:1"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--chain and --target are required") {
		t.Fatalf("delta without --chain and --target: %v", err)
	}
}
