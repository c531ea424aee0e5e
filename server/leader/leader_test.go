package leader

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The Lease records its duration in whole seconds. RenewDeadline keeps
// client-go's check (over 1.2 RetryPeriod); the Lease lasts well beyond
// it, so that a busy machine (the race detector on two shared cores)
// cannot delay a stepping-down leader past the moment another may take
// over.
const (
	testLease   = 5 * time.Second
	testRenew   = time.Second
	testRetry   = 200 * time.Millisecond
	testTimeout = 20 * time.Second
)

// candidate is one replica in the election: lead records whether it
// leads and how often its lead has ended.
type candidate struct {
	id      string
	leading atomic.Bool
	ended   atomic.Int32
	cancel  context.CancelFunc
	done    chan struct{}
}

func start(t *testing.T, client kubernetes.Interface, id string) *candidate {
	t.Helper()
	e, err := New(Config{Client: client, Namespace: "etcdbackup-system", Identity: id,
		LeaseDuration: testLease, RenewDeadline: testRenew, RetryPeriod: testRetry})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	c := &candidate{id: id, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		e.Run(ctx, func(ctx context.Context) {
			c.leading.Store(true)
			<-ctx.Done()
			c.leading.Store(false)
			c.ended.Add(1)
		})
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// eventually polls cond until it holds or testTimeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, testTimeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("after %v: %s", testTimeout, what)
	}
}

// leader waits for exactly one of cs to lead and returns it and the
// other.
func leader(t *testing.T, a, b *candidate) (leading, other *candidate) {
	t.Helper()
	eventually(t, "one candidate leads", func() bool { return a.leading.Load() || b.leading.Load() })
	if a.leading.Load() && b.leading.Load() {
		t.Fatal("both candidates lead")
	}
	if a.leading.Load() {
		return a, b
	}
	return b, a
}

// neverBoth fails the test if a and b ever lead at once while it runs;
// stop ends it.
func neverBoth(t *testing.T, a, b *candidate) (stop func()) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if a.leading.Load() && b.leading.Load() {
				t.Error("both candidates lead at once")
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func holder(t *testing.T, client *fake.Clientset) string {
	t.Helper()
	l, err := client.CoordinationV1().Leases("etcdbackup-system").Get(t.Context(), LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestOneLeads: of two candidates exactly one leads, and keeps leading
// while it renews the Lease.
//
// It runs in a synctest bubble: keeping the Lease is seen only over
// time (several lease durations with no step-down), which the bubble's
// clock lets pass without real waiting.
func TestOneLeads(t *testing.T) {
	synctest.Test(t, testOneLeads)
}

func testOneLeads(t *testing.T) {
	client := fake.NewClientset()
	a, b := start(t, client, "a"), start(t, client, "b")
	defer neverBoth(t, a, b)()
	l, other := leader(t, a, b)
	// Several lease durations: renewals keep the leader.
	time.Sleep(2 * testLease)
	if !l.leading.Load() || other.leading.Load() || l.ended.Load() != 0 {
		t.Errorf("after %v: %s leading %v (ended %d), %s leading %v", 2*testLease, l.id, l.leading.Load(), l.ended.Load(), other.id, other.leading.Load())
	}
	if h := holder(t, client); h != l.id {
		t.Errorf("Lease held by %q, want %q", h, l.id)
	}
}

// TestStepsDownWhenCutOff: a leader cut off from the API server ends
// its lead within RenewDeadline of its renewals stopping, though it
// cannot release the Lease, and the other candidate takes over once the
// Lease expires, never while the first leads.
func TestStepsDownWhenCutOff(t *testing.T) {
	api := fake.NewClientset()
	// Each candidate has a client of its own on the one API.
	var cutOff atomic.Bool
	clientOf := func(refuse bool) *fake.Clientset {
		c := &fake.Clientset{}
		c.AddReactor("*", "*", k8stesting.ObjectReaction(api.Tracker()))
		if refuse {
			c.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
				if cutOff.Load() {
					return true, nil, errors.New("the API server is out of reach")
				}
				return false, nil, nil
			})
		}
		return c
	}
	a := start(t, clientOf(true), "a")
	eventually(t, "a leads", a.leading.Load)
	b := start(t, clientOf(false), "b")
	defer neverBoth(t, a, b)()
	cut := time.Now()
	cutOff.Store(true)
	eventually(t, "a steps down", func() bool { return a.ended.Load() > 0 })
	// Its last renewal came at most a RetryPeriod before the cut.
	if d := time.Since(cut); d > testRenew+2*time.Second {
		t.Errorf("a stepped down %v after the cut, want within RenewDeadline (%v)", d, testRenew)
	}
	eventually(t, "b takes over", b.leading.Load)
	if h := holder(t, api); h != "b" {
		t.Errorf("Lease held by %q, want b", h)
	}
}

// TestReleaseOnShutdown: cancelling the leader's Run ends its lead,
// releases the Lease, and the other candidate takes over at once rather
// than after the Lease expires.
func TestReleaseOnShutdown(t *testing.T) {
	client := fake.NewClientset()
	a, b := start(t, client, "a"), start(t, client, "b")
	defer neverBoth(t, a, b)()
	l, other := leader(t, a, b)
	stopped := time.Now()
	l.cancel()
	select {
	case <-l.done:
	case <-time.After(testTimeout):
		t.Fatal("Run did not return after its context ended")
	}
	if l.leading.Load() || l.ended.Load() != 1 {
		t.Errorf("after Run returned: leading %v, lead ended %d times, want once", l.leading.Load(), l.ended.Load())
	}
	eventually(t, "the other candidate takes over", other.leading.Load)
	if d := time.Since(stopped); d >= testLease {
		t.Errorf("the other candidate took %v to lead, want less than the Lease duration (%v): the Lease was not released", d, testLease)
	}
}

// TestNewChecks: a configuration client-go would refuse fails at New,
// not at Run.
func TestNewChecks(t *testing.T) {
	client := fake.NewClientset()
	for _, c := range []Config{
		{Namespace: "ns", Identity: "a"},
		{Client: client, Identity: "a"},
		{Client: client, Namespace: "ns"},
		{Client: client, Namespace: "ns", Identity: "a", LeaseDuration: time.Second, RenewDeadline: 2 * time.Second},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted it", c)
		}
	}
	id, err := NewIdentity("etcdbackup-server-7d9f-abcde")
	if err != nil {
		t.Fatal(err)
	}
	if len(id) != len("etcdbackup-server-7d9f-abcde_")+16 {
		t.Errorf("NewIdentity = %q", id)
	}
}
