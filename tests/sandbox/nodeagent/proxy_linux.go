//go:build linux

package nodeagent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyPort is the one port of a Pod's own network namespace the node
// takes: 127.0.0.1:ProxyPort is where the Pod's Service traffic is
// redirected to. It is above the kernel's default ephemeral range
// (32768–60999), so no socket of the Pod ever gets it by chance; a container
// must not bind it explicitly.
const ProxyPort = 61000

// podProxy is kube-proxy inside one Pod's network namespace, in the spirit
// of its nftables mode: an nftables rule in the namespace DNATs every TCP
// connection to the Service range to 127.0.0.1:ProxyPort, where the agent
// accepts it, reads the original destination (SO_ORIGINAL_DST, from
// conntrack) and forwards to a ready endpoint. Nothing listens on the
// ClusterIPs themselves, so a container can bind any Service's port number
// on all addresses — as the data server binds :50051 while its own Service
// is 50051 too.
type podProxy struct {
	a  *Agent
	ln net.Listener
	wg *sync.WaitGroup // the owning worker's

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool
}

// proxyTable is the nftables table the agent owns in each Pod namespace.
const proxyTable = "sandbox-kube-proxy"

// startPodProxy installs the DNAT rule in ns and starts accepting.
func startPodProxy(a *Agent, ns *netNS, wg *sync.WaitGroup) (*podProxy, error) {
	if err := ns.withFile(func(f *netnsFile) error { return installDNAT(f, a.cfg.ServiceCIDR) }); err != nil {
		return nil, fmt.Errorf("service proxy rule: %w", err)
	}
	ln, err := ns.Listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(ProxyPort)))
	if err != nil {
		return nil, fmt.Errorf("service proxy listener: %w", err)
	}
	p := &podProxy{a: a, ln: ln, wg: wg, conns: map[net.Conn]struct{}{}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.serve()
	}()
	return p, nil
}

// installDNAT adds, in the namespace: table ip sandbox-kube-proxy, chain
// output (nat hook, dstnat priority): ip daddr SERVICE-CIDR tcp → dnat to
// 127.0.0.1:ProxyPort. Locally generated packets to a loopback address
// stay on lo, so no route_localnet is needed.
func installDNAT(f *netnsFile, cidr netip.Prefix) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		return err
	}
	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: proxyTable})
	chain := c.AddChain(&nftables.Chain{
		Name: "output", Table: table,
		Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest,
	})
	mask := net.CIDRMask(cidr.Bits(), 32)
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}, // daddr
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: cidr.Masked().Addr().AsSlice()},
		&expr.Immediate{Register: 1, Data: []byte{127, 0, 0, 1}},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(ProxyPort)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
	}})
	return c.Flush()
}

func (p *podProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.forward(c)
		}()
	}
}

func (p *podProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *podProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// forward connects c to an endpoint of the Service it was meant for and
// copies both ways until both sides are done. No such Service, or no
// endpoint: the connection is closed at once, as kube-proxy rejects
// connections to a Service without endpoints.
func (p *podProxy) forward(c net.Conn) {
	defer c.Close()
	dst, err := originalDst(c)
	if err != nil {
		p.a.cfg.Logf("proxy: %v", err)
		return
	}
	t, ok := p.a.serviceAt(dst)
	if !ok {
		p.a.cfg.Logf("proxy: no service at %s", dst)
		return
	}
	ctx, cancel := context.WithTimeout(p.a.ctx, 10*time.Second)
	up, err := p.a.dialService(ctx, t)
	cancel()
	if err != nil {
		p.a.cfg.Logf("proxy: service %s/%s port %d: %v", t.svc.Namespace, t.svc.Name, t.port.Port, err)
		return
	}
	defer up.Close()
	// Tracked like the client side, so closing the proxy ends both.
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close so the other direction can finish its reply.
		if tc, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	<-done
}

// originalDst is the destination the client dialled before the DNAT.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var mreq *unix.IPv6Mreq
	var serr error
	if err := raw.Control(func(fd uintptr) {
		// The usual trick: SO_ORIGINAL_DST fills a sockaddr_in, which
		// fits the 20 bytes of an ipv6_mreq.
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", serr)
	}
	b := mreq.Multiaddr
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4])), nil
}

// close stops accepting and ends every proxied connection; the goroutines
// end soon after (the worker's WaitGroup waits for them).
func (p *podProxy) close() {
	p.mu.Lock()
	p.closing = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}

// serviceTarget is one TCP port of one Service.
type serviceTarget struct {
	svc  *corev1.Service
	port corev1.ServicePort
}

// serviceAt finds the Service port behind a ClusterIP:port.
func (a *Agent) serviceAt(dst netip.AddrPort) (serviceTarget, bool) {
	ip := dst.Addr().String()
	for _, svc := range a.services() {
		if svc.Spec.ClusterIP != ip {
			continue
		}
		for _, port := range svc.Spec.Ports {
			if uint16(port.Port) == dst.Port() && (port.Protocol == "" || port.Protocol == corev1.ProtocolTCP) {
				return serviceTarget{svc: svc, port: port}, true
			}
		}
	}
	return serviceTarget{}, false
}

// dialService picks where a connection to a Service port goes: the API
// server for `kubernetes`, a host loopback address for a Service with the
// host-target annotation, else a random ready endpoint.
func (a *Agent) dialService(ctx context.Context, t serviceTarget) (net.Conn, error) {
	if t.svc.Namespace == metav1.NamespaceDefault && t.svc.Name == "kubernetes" {
		return dialHostLoopback(ctx, a.cfg.APIServerAddr)
	}
	if ann, ok := t.svc.Annotations[HostTargetAnnotation]; ok {
		addr, err := hostTarget(ann, t.port)
		if err != nil {
			return nil, err
		}
		return dialHostLoopback(ctx, addr)
	}
	eps := a.endpointsFor(t.svc, t.port)
	if len(eps) == 0 {
		return nil, errors.New("no ready endpoints")
	}
	rand.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
	var errs []error
	for _, ep := range eps {
		c, err := a.dialEndpoint(ctx, ep)
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	return nil, errors.Join(errs...)
}

// hostTarget reads HostTargetAnnotation for one Service port.
func hostTarget(ann string, port corev1.ServicePort) (string, error) {
	for _, item := range strings.Split(ann, ",") {
		key, addr, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return "", fmt.Errorf("annotation %s: %q is not PORT=HOST:PORT", HostTargetAnnotation, item)
		}
		if key == port.Name || key == strconv.Itoa(int(port.Port)) {
			if _, err := netip.ParseAddrPort(addr); err != nil {
				return "", fmt.Errorf("annotation %s: %q: %w", HostTargetAnnotation, addr, err)
			}
			return addr, nil
		}
	}
	return "", fmt.Errorf("annotation %s has no target for port %d", HostTargetAnnotation, port.Port)
}
