package jobs_test

import (
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// versionedLeases gives the fake's Leases a new resourceVersion on every
// write, as the API server does (the fake's tracker keeps whatever it is
// given).
func versionedLeases(cs *fake.Clientset) {
	var v atomic.Int64
	bump := func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(interface{ GetObject() runtime.Object }).GetObject().(*coordinationv1.Lease)
		o.ResourceVersion = strconv.FormatInt(v.Add(1), 10)
		return false, nil, nil
	}
	cs.PrependReactor("create", "leases", bump)
	cs.PrependReactor("update", "leases", bump)
}

// A delta agent holds its target's Lease through the server: the server
// writes it only as client-go's elector would, for the calling pod alone.
func TestPutDeltaLease(t *testing.T) {
	cs := fake.NewClientset()
	versionedLeases(cs)
	l, err := jobs.New(cs, ns, config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const target = "app"
	refused := func(t *testing.T, err error, want string) {
		t.Helper()
		if !errors.Is(err, jobs.ErrDeltaLeaseRefused) || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want a refusal saying %q", err, want)
		}
	}

	if _, err := l.GetDeltaLease(ctx, target); !errors.Is(err, jobs.ErrNoDeltaLease) {
		t.Fatalf("GetDeltaLease before any: %v", err)
	}
	_, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-b_1", DurationSeconds: 15})
	refused(t, err, `holder "pod-b_1" is not of the calling pod pod-a`)
	_, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a", DurationSeconds: 15})
	refused(t, err, "is not of the calling pod")
	_, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a_1", DurationSeconds: 3600})
	refused(t, err, "outside 1..300s")
	_, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a_1", DurationSeconds: 15, Transitions: 9})
	refused(t, err, "with 0 transitions")

	a, err := l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a_1", DurationSeconds: 15})
	if err != nil {
		t.Fatal(err)
	}
	if a.Holder != "pod-a_1" || a.Transitions != 0 || a.RenewTime.IsZero() || a.ResourceVersion == "" {
		t.Fatalf("created %+v", a)
	}
	if _, err := l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a_1", DurationSeconds: 15}); !errors.Is(err, jobs.ErrDeltaLeaseChanged) {
		t.Fatalf("second create: %v", err)
	}
	// Only the target's own Lease, named by the server.
	stored, err := cs.CoordinationV1().Leases(ns).Get(ctx, jobs.DeltaLeaseName(target), metav1.GetOptions{})
	if err != nil || *stored.Spec.HolderIdentity != "pod-a_1" {
		t.Fatalf("stored Lease: %v, %v", stored, err)
	}

	// Another pod may not take it while pod-a renews it, whatever it
	// claims; it may not release it either.
	_, err = l.PutDeltaLease(ctx, target, "pod-b", jobs.DeltaLease{Holder: "pod-b_2", DurationSeconds: 15, Transitions: 1, ResourceVersion: a.ResourceVersion})
	refused(t, err, `"pod-a_1" holds it until`)
	_, err = l.PutDeltaLease(ctx, target, "pod-b", jobs.DeltaLease{Holder: "", DurationSeconds: 1, ResourceVersion: a.ResourceVersion})
	refused(t, err, "only its holder releases it")
	// A renewal from a stale read is refused as the API server would.
	_, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a_1", DurationSeconds: 15, ResourceVersion: "stale"})
	if !errors.Is(err, jobs.ErrDeltaLeaseChanged) {
		t.Fatalf("stale renewal: %v", err)
	}
	_, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a_1", DurationSeconds: 15, Transitions: 3, ResourceVersion: a.ResourceVersion})
	refused(t, err, "a renewal keeps the transitions (0), not 3")
	// A renewal of what this server wrote last costs one update, no read.
	before := len(cs.Actions())
	a, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "pod-a_1", DurationSeconds: 15, ResourceVersion: a.ResourceVersion})
	if err != nil || a.Holder != "pod-a_1" {
		t.Fatalf("renewal: %+v, %v", a, err)
	}
	if acts := cs.Actions()[before:]; len(acts) != 1 || acts[0].GetVerb() != "update" {
		t.Fatalf("a renewal made %d API calls (%v); want one update", len(acts), acts)
	}
	// The holder releases it; then another pod takes it, in a new epoch.
	a, err = l.PutDeltaLease(ctx, target, "pod-a", jobs.DeltaLease{Holder: "", DurationSeconds: 1, ResourceVersion: a.ResourceVersion})
	if err != nil || a.Holder != "" {
		t.Fatalf("release: %+v, %v", a, err)
	}
	_, err = l.PutDeltaLease(ctx, target, "pod-b", jobs.DeltaLease{Holder: "pod-b_2", DurationSeconds: 15, ResourceVersion: a.ResourceVersion})
	refused(t, err, "raises the transitions to 1, not 0")
	b, err := l.PutDeltaLease(ctx, target, "pod-b", jobs.DeltaLease{Holder: "pod-b_2", DurationSeconds: 15, Transitions: 1, ResourceVersion: a.ResourceVersion})
	if err != nil || b.Holder != "pod-b_2" || b.Transitions != 1 {
		t.Fatalf("takeover after release: %+v, %v", b, err)
	}
	// The fence sees the new holder in its epoch.
	if err := l.CheckDeltaWriter(ctx, target, "pod-b", 1, 0); err != nil {
		t.Fatalf("fence after takeover: %v", err)
	}
	if err := l.CheckDeltaWriter(ctx, target, "pod-a", 0, 0); !errors.Is(err, jobs.ErrNotDeltaWriter) {
		t.Fatalf("fence lets the old holder through: %v", err)
	}
}
