package nodeagent

import (
	"fmt"
	"net/netip"
	"sync"
)

// PodCIDR is the range Pod IPs come from. Pod IPs must not be loopback
// addresses (the API server refuses them in EndpointSlices), but no traffic
// is ever sent to them from the host: each one exists only on the `lo` of
// its Pod's own network namespace, and the node dials Pods at 127.0.0.1
// inside that namespace, as a container runtime's port-forward does.
var PodCIDR = netip.MustParsePrefix("10.244.0.0/16")

// ipam hands out Pod IPs round-robin, so a freed address is not reused at
// once (a stale EndpointSlice should not point at a new Pod).
type ipam struct {
	mu   sync.Mutex
	next netip.Addr
	used map[netip.Addr]bool
}

func newIPAM() *ipam {
	return &ipam{next: PodCIDR.Addr().Next().Next(), used: map[netip.Addr]bool{}}
}

func (p *ipam) allocate() (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	size := 1 << (32 - PodCIDR.Bits())
	for range size {
		a := p.next
		p.next = p.next.Next()
		if !PodCIDR.Contains(p.next) {
			p.next = PodCIDR.Addr().Next().Next()
		}
		last := a.As4()
		// Skip network, gateway-like .0/.1 and broadcast-like .255 addresses
		// of each /24: not needed, but they look wrong in a Pod's status.
		if last[3] == 0 || last[3] == 1 || last[3] == 255 || p.used[a] {
			continue
		}
		p.used[a] = true
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("no free Pod IP in %s", PodCIDR)
}

func (p *ipam) release(a netip.Addr) {
	p.mu.Lock()
	delete(p.used, a)
	p.mu.Unlock()
}
