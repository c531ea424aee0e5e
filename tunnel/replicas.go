package tunnel

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// brokenFor is how long a replica whose tunnel broke is passed over while
// another is ready: long enough for the API server to learn that it is
// going (deleted, its node lost), short enough that a replica that only
// hiccuped serves again soon.
const brokenFor = time.Minute

// markBroken remembers that a tunnel to pod broke, so that the next dial
// goes to another ready replica at once instead of back to one that may
// be dying while the API server still shows it ready.
func (d *Dialer) markBroken(pod *corev1.Pod) {
	d.brokenMu.Lock()
	defer d.brokenMu.Unlock()
	if d.broken == nil {
		d.broken = map[types.UID]time.Time{}
	}
	d.broken[pod.UID] = d.clock()
}

// pick is the first of the ready pods whose tunnel has not broken lately,
// or the first of them when every one has.
func (d *Dialer) pick(ready []*corev1.Pod) *corev1.Pod {
	d.brokenMu.Lock()
	defer d.brokenMu.Unlock()
	now := d.clock()
	for _, p := range ready {
		if at, ok := d.broken[p.UID]; !ok || now.Sub(at) >= brokenFor {
			return p
		}
	}
	return ready[0]
}

func (d *Dialer) clock() time.Time {
	if d.now != nil {
		return d.now()
	}
	return time.Now()
}
