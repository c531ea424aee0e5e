package tunnel

import (
	"context"
	"net"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// Hint names the pod and port a dial reached before (a previous run's
// Resolved endpoint). The port-forward's upgrade — a second connection
// to the API server, and the API server's to the kubelet — is the
// slowest part of a dial; with a hint it starts while the Service and
// its pods are looked up, instead of after.
//
// A hint is only a guess: the tunnel it opens is used only when the
// lookup confirms that the Service selects that pod, Running and Ready,
// with that port. Until then nothing reaches the pod — the forwarded
// connection to its port is made by creating streams, after the check —
// and a wrong guess is closed unused.
type Hint struct {
	Pod  string
	Port int32
}

// SetHint gives the next dial a hint. Later dials (gRPC's re-dials after
// the pod was replaced) resolve first, as without one.
func (d *Dialer) SetHint(h Hint) {
	if h.Pod == "" || h.Port <= 0 {
		return
	}
	d.hint.Store(&h)
}

// dialHinted is DialContext with the upgrade to h's pod started beside
// Resolve.
func (d *Dialer) dialHinted(ctx context.Context, h *Hint) (net.Conn, error) {
	type upgraded struct {
		conn streamhttp.Connection
		err  error
	}
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := make(chan upgraded, 1)
	go func() {
		dialer, err := d.dialerFor(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.target.Namespace, Name: h.Pod}})
		if err != nil {
			up <- upgraded{nil, err}
			return
		}
		c, err := d.upgrade(uctx, dialer)
		up <- upgraded{c, err}
	}()
	// discard closes the guessed connection, whenever it arrives.
	discard := func() {
		cancel()
		go func() {
			if r := <-up; r.conn != nil {
				r.conn.Close()
			}
		}()
	}

	ep, err := d.resolve(ctx)
	if err != nil {
		discard()
		return nil, err
	}
	if ep.Pod.Namespace != d.target.Namespace || ep.Pod.Name != h.Pod || ep.Port != h.Port {
		d.trace("prefetch: hint " + h.Pod + " missed")
		discard()
		return d.DialEndpoint(ctx, ep)
	}
	var r upgraded
	select {
	case r = <-up:
	case <-ctx.Done():
		discard()
		return nil, ctx.Err()
	}
	if r.err != nil {
		// Dial again without guessing, so the error (RBAC, say) is
		// explained as it would be without a hint.
		return d.DialEndpoint(ctx, ep)
	}
	d.trace("prefetch: hint " + h.Pod + " used")
	return d.streams(r.conn, ep)
}
