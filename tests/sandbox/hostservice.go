package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ExposeHostService makes a service of the host (the sandbox's etcd, an S3
// server, a test's own etcd) reachable from pods as Service ns/name on
// port, the way a cluster reaches an outside service: a Service without a
// selector and an EndpointSlice naming the host's address. The host end of
// the node's veth (HostIP) is the only host address pods can reach; a
// target on another address (a loopback one) is relayed from a port on
// HostIP by the sandbox.
func (s *Sandbox) ExposeHostService(ctx context.Context, ns, name string, port int32, target string) error {
	host, p, err := net.SplitHostPort(target)
	if err != nil {
		return fmt.Errorf("sandbox: expose %s/%s: target %q: %w", ns, name, target, err)
	}
	targetPort, err := strconv.Atoi(p)
	if err != nil {
		return fmt.Errorf("sandbox: expose %s/%s: target %q: bad port", ns, name, target)
	}
	if host != HostIP {
		addr, err := s.forwarders.relay(target)
		if err != nil {
			return fmt.Errorf("sandbox: expose %s/%s: %w", ns, name, err)
		}
		targetPort = addr.Port
	}
	if err := s.EnsureNamespace(ctx, ns); err != nil {
		return err
	}
	_, err = s.client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "main", Port: port, Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("sandbox: create service %s/%s: %w", ns, name, err)
	}
	_, err = s.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name + "-host",
			Namespace: ns,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: name,
				discoveryv1.LabelManagedBy:   "sandbox.etcdbackup.io",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{HostIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("main"), Port: ptr.To(int32(targetPort)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("sandbox: create endpoint slice of %s/%s: %w", ns, name, err)
	}
	return s.WaitForServiceRouted(ctx, ns, name)
}

// WaitForServiceRouted waits until every node's kube-proxy has programmed its
// nftables rules for Service ns/name with every ready endpoint of its
// EndpointSlices (at least one), so a pod started next reaches it: before
// that, its ClusterIP refuses connections or leads to a pod that is gone.
func (s *Sandbox) WaitForServiceRouted(ctx context.Context, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	chain := regexp.MustCompile(`chain service-[A-Z0-9]+-` + regexp.QuoteMeta(ns+"/"+name+"/") + `[^{]*\{([^}]*)\}`)
	return poll(ctx, "kube-proxy to route Service "+ns+"/"+name, func() (bool, string, error) {
		slices, err := s.client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
		if err != nil {
			return false, "", fmt.Errorf("sandbox: endpoint slices of %s/%s: %w", ns, name, err)
		}
		var ready []string
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				if ptr.Deref(ep.Conditions.Ready, false) {
					ready = append(ready, ep.Addresses...)
				}
			}
		}
		if len(ready) == 0 {
			return false, "no ready endpoint", nil
		}
		// Every node's kube-proxy: a client pod may run on any.
		for _, n := range s.allNodes() {
			out, err := n.exec(ctx, "nft", "list", "table", "ip", "kube-proxy")
			if err != nil {
				return false, err.Error(), nil
			}
			var rules string
			for _, m := range chain.FindAllStringSubmatch(out, -1) {
				rules += m[1]
			}
			for _, addr := range ready {
				if !strings.Contains(rules, "dnat") || !regexp.MustCompile(`\b`+regexp.QuoteMeta(addr)+`\b`).MatchString(rules) {
					return false, fmt.Sprintf("endpoint %s not in %s's kube-proxy rules yet", addr, n.spec.name), nil
				}
			}
		}
		return true, "", nil
	})
}

// EnsureNamespace creates the namespace and its ServiceAccount "default" if
// they are missing. The controller-manager creates the account too, moments
// after the namespace; creating it here means a Pod created right after
// never meets the ServiceAccount admission plugin's "not found".
func (s *Sandbox) EnsureNamespace(ctx context.Context, ns string) error {
	_, err := s.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: create namespace %s: %w", ns, err)
	}
	_, err = s.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: create service account %s/default: %w", ns, err)
	}
	return nil
}

// forwarders relay TCP connections from ports on HostIP to loopback
// services of the host. They live as long as the sandbox.
type forwarders struct {
	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	stopped   bool
	wg        sync.WaitGroup
}

func newForwarders() *forwarders { return &forwarders{conns: map[net.Conn]struct{}{}} }

// relay listens on a free port of HostIP and relays each connection to
// target; it returns the listening address.
func (f *forwarders) relay(target string) (*net.TCPAddr, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(HostIP, "0"))
	if err != nil {
		return nil, fmt.Errorf("relay to %s: %w", target, err)
	}
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		ln.Close()
		return nil, errors.New("sandbox stopped")
	}
	f.listeners = append(f.listeners, ln)
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.pipe(c, target)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr), nil
}

// pipe copies both ways between c and a new connection to target until
// either side is done.
func (f *forwarders) pipe(c net.Conn, target string) {
	t, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	if !f.track(c, t) {
		return
	}
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(t, c)
	go cp(c, t)
	<-done
	<-done
	f.untrack(c, t)
}

func (f *forwarders) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *forwarders) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		delete(f.conns, c)
		c.Close()
	}
}

// stop closes every listener and connection and waits for the relays.
func (f *forwarders) stop() {
	f.mu.Lock()
	f.stopped = true
	for _, ln := range f.listeners {
		ln.Close()
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
