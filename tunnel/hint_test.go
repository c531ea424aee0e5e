package tunnel

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// fakeUpgrades stands in for the API server's port-forward upgrade: each
// Dial reaches a kubelet of its own, recorded with the pod it was for.
type fakeUpgrades struct {
	t    *testing.T
	mu   sync.Mutex
	pods []string
	kube map[string][]*kubelet
	// fail makes the next upgrades fail, one error each.
	fail []error
}

type fakeStreamDialer struct {
	u   *fakeUpgrades
	pod string
}

func (f fakeStreamDialer) Dial(...string) (streamhttp.Connection, string, error) {
	u := f.u
	u.mu.Lock()
	u.pods = append(u.pods, f.pod)
	var err error
	if len(u.fail) > 0 {
		err, u.fail = u.fail[0], u.fail[1:]
	}
	u.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	k, sc := startKubelet(u.t)
	u.mu.Lock()
	u.kube[f.pod] = append(u.kube[f.pod], k)
	u.mu.Unlock()
	return sc, "", nil
}

func (u *fakeUpgrades) dialerFor(p *corev1.Pod) (streamhttp.Dialer, error) {
	return fakeStreamDialer{u: u, pod: p.Name}, nil
}

// streamsOn is how many streams the i-th upgrade to pod saw.
func (u *fakeUpgrades) streamsOn(pod string, i int) int {
	u.mu.Lock()
	k := u.kube[pod][i]
	u.mu.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.headers)
}

func hintedDialer(t *testing.T, h Hint, objects ...corev1.Pod) (*Dialer, *fakeUpgrades, *[]string) {
	t.Helper()
	objs := []runtime.Object{service("etcdbackup", grpcPort(intstr.FromString("grpc")))}
	for i := range objects {
		objs = append(objs, &objects[i])
	}
	d, _ := testDialer(t, Target{}, objs...)
	u := &fakeUpgrades{t: t, kube: map[string][]*kubelet{}}
	d.dialerFor = u.dialerFor
	var resolved []string
	d.Resolved = func(ep *Endpoint) { resolved = append(resolved, ep.Pod.Name) }
	d.SetHint(h)
	return d, u, &resolved
}

func dial(t *testing.T, d *Dialer) (*Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c.(*Conn), nil
}

func TestHintUsedWhenTheServiceSelectsThatPod(t *testing.T) {
	d, u, resolved := hintedDialer(t, Hint{Pod: "server-1", Port: 9443}, *pod("server-1"))
	c, err := dial(t, d)
	if err != nil {
		t.Fatal(err)
	}
	if c.Endpoint().Pod.Name != "server-1" || c.Endpoint().Port != 9443 {
		t.Fatalf("endpoint %s, want server-1 port 9443", c.Endpoint())
	}
	if len(u.pods) != 1 || u.streamsOn("server-1", 0) != 2 {
		t.Fatalf("upgrades to %v, streams on the first %d; want one upgrade, to server-1, carrying the tunnel", u.pods, u.streamsOn("server-1", 0))
	}
	if len(*resolved) != 1 || (*resolved)[0] != "server-1" {
		t.Fatalf("Resolved told %v, want [server-1]", *resolved)
	}

	// The hint serves one dial: the next resolves first.
	if d.hint.Load() != nil {
		t.Fatal("hint still set after the dial that used it")
	}
}

// A hint naming another pod (replaced since) or port is not used: its
// connection is closed without a stream, so nothing reached that pod.
func TestHintMissedIsClosedUnused(t *testing.T) {
	for _, h := range []Hint{{Pod: "server-old", Port: 9443}, {Pod: "server-1", Port: 50051}} {
		d, u, _ := hintedDialer(t, h, *pod("server-1"))
		c, err := dial(t, d)
		if err != nil {
			t.Fatal(err)
		}
		if c.Endpoint().Pod.Name != "server-1" {
			t.Fatalf("hint %+v: endpoint %s, want server-1", h, c.Endpoint())
		}
		u.mu.Lock()
		pods := append([]string(nil), u.pods...)
		toHinted := append(u.kube[h.Pod][:0:0], u.kube[h.Pod]...)
		u.mu.Unlock()
		// The two upgrades run side by side, in either order.
		if len(pods) != 2 || !slices.Contains(pods, h.Pod) || !slices.Contains(pods, "server-1") {
			t.Fatalf("hint %+v: upgrades to %v, want the hint's and server-1", h, pods)
		}
		// A hint with the right pod but another port upgrades to the
		// same pod twice, in either order: the guessed connection is the
		// one without streams, and the other must carry the tunnel.
		streams := func(c *kubelet) int {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.headers)
		}
		var hinted *kubelet
		carrying := 0
		for _, c := range toHinted {
			switch n := streams(c); {
			case n == 0 && hinted == nil:
				hinted = c
			case n == 2:
				carrying++
			}
		}
		if hinted == nil {
			t.Fatalf("hint %+v: streams on the hinted connection, want none", h)
		}
		if len(toHinted) == 2 && carrying != 1 {
			t.Fatalf("hint %+v: %d of the upgrades to server-1 carry the tunnel's two streams, want 1", h, carrying)
		}
		select {
		case <-hinted.conn.CloseChan():
		case <-time.After(10 * time.Second):
			t.Fatalf("hint %+v: hinted connection not closed", h)
		}
	}
}

// When the lookup fails, its error is the dial's, as without a hint.
func TestHintDoesNotHideResolveErrors(t *testing.T) {
	d, u, _ := hintedDialer(t, Hint{Pod: "server-1", Port: 9443}, *pod("server-1", notReady))
	_, err := dial(t, d)
	var nr *NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("dial: %v, want a NotReadyError", err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, ks := range u.kube {
		for _, k := range ks {
			k.mu.Lock()
			n := len(k.headers)
			k.mu.Unlock()
			if n != 0 {
				t.Fatalf("%d streams on a connection to a pod that is not ready", n)
			}
		}
	}
}

// A hinted upgrade that fails is tried again once the pod is confirmed,
// so a failure is explained as without a hint.
func TestHintedUpgradeFailureDialsAgain(t *testing.T) {
	d, u, _ := hintedDialer(t, Hint{Pod: "server-1", Port: 9443}, *pod("server-1"))
	u.fail = []error{errors.New("unable to upgrade connection: pod not found")}
	if _, err := dial(t, d); err != nil {
		t.Fatal(err)
	}
	if len(u.pods) != 2 {
		t.Fatalf("upgrades to %v, want two to server-1", u.pods)
	}

	d, u, _ = hintedDialer(t, Hint{Pod: "server-1", Port: 9443}, *pod("server-1"))
	refused := errors.New("unable to upgrade connection: Forbidden")
	u.fail = []error{refused, refused}
	_, err := dial(t, d)
	if !errors.Is(err, refused) || len(u.pods) != 2 {
		t.Fatalf("dial: %v after upgrades to %v; want the second upgrade's refusal, explained", err, u.pods)
	}
}
