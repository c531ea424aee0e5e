package coord

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const ns = "etcdbackup-system"

// clock is an injected clock the test moves.
type clock struct{ now atomic.Pointer[time.Time] }

func newClock() *clock {
	c := &clock{}
	t := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	c.now.Store(&t)
	return c
}
func (c *clock) Now() time.Time { return *c.now.Load() }
func (c *clock) Add(d time.Duration) {
	t := c.Now().Add(d)
	c.now.Store(&t)
}

// replica is a Leases registry of replica id on the API behind client.
func replica(t *testing.T, client *fake.Clientset, id string, c *clock) *Leases {
	t.Helper()
	l, err := NewLeases(LeasesConfig{Client: client, Namespace: ns, Identity: id, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func wantCode(t *testing.T, what string, err error, code codes.Code, says string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v, want %v", what, err, code)
	}
	if says != "" && !strings.Contains(err.Error(), says) {
		t.Fatalf("%s: %q does not say %q", what, err, says)
	}
}

func leaseCount(t *testing.T, client *fake.Clientset) int {
	t.Helper()
	l, err := client.CoordinationV1().Leases(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// TestLocal: one replica's registry refuses a second upload of a name,
// keeps a backup being sent from removal and refuses to send one being
// removed; each release undoes its claim.
func TestLocal(t *testing.T) {
	ctx := t.Context()
	l := NewLocal()
	release, err := l.ClaimUpload(ctx, "default", "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.ClaimUpload(ctx, "default", "a")
	wantCode(t, "second upload of a", err, codes.AlreadyExists, "choose another name")
	other, err := l.ClaimUpload(ctx, "s3", "a") // another location, another name
	if err != nil {
		t.Fatal(err)
	}
	other()
	release()
	if release, err = l.ClaimUpload(ctx, "default", "a"); err != nil {
		t.Fatalf("upload after the first ended: %v", err)
	}
	release()

	done, err := l.Send(ctx, "default", "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := l.Remove(ctx, "default", "b"); ok {
		t.Fatal("removal of a backup being sent was allowed")
	}
	done()
	removed, ok, err := l.Remove(ctx, "default", "b")
	if !ok || err != nil {
		t.Fatalf("removal after the send ended: ok %v, %v", ok, err)
	}
	_, err = l.Send(ctx, "default", "b")
	wantCode(t, "send of a backup being removed", err, codes.NotFound, "being removed")
	removed()
	if done, err = l.Send(ctx, "default", "b"); err != nil {
		t.Fatalf("send after the removal ended: %v", err)
	}
	done()
}

// TestLeasesAcrossReplicas: what one replica claims the other sees,
// named; releases delete the Leases.
func TestLeasesAcrossReplicas(t *testing.T) {
	ctx := t.Context()
	client, c := fake.NewClientset(), newClock()
	a, b := replica(t, client, "server-a", c), replica(t, client, "server-b", c)

	release, err := a.ClaimUpload(ctx, "default", "cp")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.ClaimUpload(ctx, "default", "cp")
	wantCode(t, "the same upload name on the other replica", err, codes.AlreadyExists, "on server replica server-a")
	release()
	if n := leaseCount(t, client); n != 0 {
		t.Fatalf("%d Leases left after the upload ended", n)
	}
	if release, err = b.ClaimUpload(ctx, "default", "cp"); err != nil {
		t.Fatalf("the name after the first upload ended: %v", err)
	}
	release()

	// Two replicas may send one backup at once; neither may remove it.
	sentA, err := a.Send(ctx, "default", "cp")
	if err != nil {
		t.Fatal(err)
	}
	sentB, err := b.Send(ctx, "default", "cp")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.Remove(ctx, "default", "cp"); ok || err != nil {
		t.Fatalf("removal of a backup two replicas send: ok %v, %v", ok, err)
	}
	sentB()
	if _, ok, err := b.Remove(ctx, "default", "cp"); ok || err != nil {
		t.Fatalf("removal of a backup the other replica sends: ok %v, %v", ok, err)
	}
	sentA()
	removed, ok, err := b.Remove(ctx, "default", "cp")
	if !ok || err != nil {
		t.Fatalf("removal once nobody sends: ok %v, %v", ok, err)
	}
	_, err = a.Send(ctx, "default", "cp")
	wantCode(t, "send of a backup the other replica removes", err, codes.NotFound, "being removed")
	removed()
	if n := leaseCount(t, client); n != 0 {
		t.Fatalf("%d Leases left after every claim ended", n)
	}
}

// TestLeasesOfADeadReplica: a replica that stops renewing (it died)
// blocks a name only until its Lease lapses; then another replica takes
// the name, and Run deletes what it left.
func TestLeasesOfADeadReplica(t *testing.T) {
	ctx := t.Context()
	client, c := fake.NewClientset(), newClock()
	dead, live := replica(t, client, "server-a", c), replica(t, client, "server-b", c)
	h, _, err := dead.acquire(ctx, kindUpload, "default", "cp")
	if err != nil || h == nil {
		t.Fatalf("acquire: %v", err)
	}
	h.cancel() // it dies: no more renewals, no release
	<-h.done
	if _, err := dead.leases.Create(ctx, dead.newLease(leaseName(kindSend, "default", "cp")+"-dead", kindSend, "default", "cp"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	_, err = live.ClaimUpload(ctx, "default", "cp")
	wantCode(t, "the name while its Lease is fresh", err, codes.AlreadyExists, "server-a")
	if _, ok, _ := live.Remove(ctx, "default", "cp"); ok {
		t.Fatal("removal while the dead replica's send Lease is fresh")
	}
	c.Add(DefaultDuration + clockSkew + time.Second)
	release, err := live.ClaimUpload(ctx, "default", "cp")
	if err != nil {
		t.Fatalf("the name after the dead replica's Lease lapsed: %v", err)
	}
	release()
	removed, ok, err := live.Remove(ctx, "default", "cp")
	if !ok || err != nil {
		t.Fatalf("removal after the dead replica's send lapsed: ok %v, %v", ok, err)
	}
	removed()
	if n := leaseCount(t, client); n != 0 {
		t.Fatalf("%d Leases left: the lapsed send was not deleted", n)
	}

	// Run deletes lapsed Leases it finds, and leaves fresh ones.
	if _, err := dead.leases.Create(ctx, dead.newLease("etcdbackup-upload-lapsed", kindUpload, "default", "x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Add(DefaultDuration + clockSkew + time.Second)
	fresh, err := live.ClaimUpload(ctx, "default", "y")
	if err != nil {
		t.Fatal(err)
	}
	defer fresh()
	live.sweep = 10 * time.Millisecond
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); live.Run(runCtx) }()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return leaseCount(t, client) == 1, nil
	}); err != nil {
		t.Fatalf("Run left %d Leases, want the fresh one alone", leaseCount(t, client))
	}
	stop()
	<-ran
}

// TestLeasesWithoutTheAPI: with the API server out of reach, uploads
// and sends go on (one replica's claims still hold), removals do not, and
// the refusal says why.
func TestLeasesWithoutTheAPI(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset()
	client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	l := replica(t, client, "server-a", newClock())
	release, err := l.ClaimUpload(ctx, "default", "cp")
	if err != nil {
		t.Fatalf("upload without the API: %v", err)
	}
	_, err = l.ClaimUpload(ctx, "default", "cp")
	wantCode(t, "a second upload of the name on this replica", err, codes.AlreadyExists, "")
	release()
	done, err := l.Send(ctx, "default", "cp")
	if err != nil {
		t.Fatalf("send without the API: %v", err)
	}
	done()
	_, ok, err := l.Remove(ctx, "default", "cp")
	if ok {
		t.Fatal("removal without the API was allowed")
	}
	wantCode(t, "removal without the API", err, codes.Unavailable, "so it is kept")
}
