package tunnel

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func withUID(uid string) podOpt { return func(p *corev1.Pod) { p.UID = types.UID(uid) } }

// TestDialPassesOverBrokenReplicas: with several ready replicas, a dial
// after a tunnel broke goes to another one at once (the broken one may be
// dying while the API server still shows it ready); it is picked again
// when every other one broke too, and once brokenFor has passed.
func TestDialPassesOverBrokenReplicas(t *testing.T) {
	d, _ := testDialer(t, Target{}, service("etcdbackup", grpcPort(intstr.FromString("grpc"))),
		pod("server-a", withUID("a")), pod("server-b", withUID("b")))
	u := &fakeUpgrades{t: t, kube: map[string][]*kubelet{}}
	d.dialerFor = u.dialerFor
	now := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	d.now = func() time.Time { return now }
	dial := func() *Conn {
		t.Helper()
		c, err := d.DialContext(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*Conn)
	}
	first := dial()
	if again := dial(); again.Endpoint().Pod.Name != first.Endpoint().Pod.Name {
		t.Fatalf("with no tunnel broken the dialer moved from %s to %s", first.Endpoint().Pod.Name, again.Endpoint().Pod.Name)
	}
	first.fail(errors.New("port-forward: connection to the API server closed"))
	second := dial()
	if second.Endpoint().Pod.Name == first.Endpoint().Pod.Name {
		t.Fatalf("after the tunnel to %s broke, the next dial went to it again", first.Endpoint().Pod.Name)
	}
	second.fail(errors.New("port-forward: connection to the API server closed"))
	if c := dial(); c.Endpoint().Pod.Name != first.Endpoint().Pod.Name {
		t.Fatalf("with every replica broken, dialed %s, want the first ready one, %s", c.Endpoint().Pod.Name, first.Endpoint().Pod.Name)
	}
	now = now.Add(brokenFor)
	if c := dial(); c.Endpoint().Pod.Name != first.Endpoint().Pod.Name {
		t.Fatalf("after brokenFor, dialed %s, want %s again", c.Endpoint().Pod.Name, first.Endpoint().Pod.Name)
	}
	// Closing a tunnel is not breaking it.
	now = now.Add(brokenFor)
	c := dial()
	c.Close()
	if again := dial(); again.Endpoint().Pod.Name != c.Endpoint().Pod.Name {
		t.Fatalf("after a tunnel was closed, the dialer moved from %s to %s", c.Endpoint().Pod.Name, again.Endpoint().Pod.Name)
	}
}
