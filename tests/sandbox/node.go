package sandbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
)

// NodeName is the name of the single Node object the sandbox registers; every
// pod from RunPod is bound to it.
const NodeName = "sandbox-node"

// Timeouts the kubelet's streaming server uses by default
// (streaming.DefaultConfig): a forwarded connection idle for 4 hours is
// closed, and both streams of a pair must arrive within 30 s.
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = 30 * time.Second
)

// errDropped is what a forwarded connection reports when a test drops it;
// the client sees it on the port-forward error stream, like any error a real
// kubelet reports when the pod side of a forward breaks.
var errDropped = errors.New("forwarded connection dropped by the sandbox (DropForwardedConnections)")

// podKey names a pod on the node.
type podKey struct{ namespace, name string }

// podEntry is what the node endpoint knows about a hand-run pod (RunPod):
// enough to answer the kubelet's port-forward lookups.
type podEntry struct {
	uid     types.UID
	ip      netip.Addr       // its Pod IP (EndpointSlices refuse loopback ones)
	targets map[int32]string // container port → local TCP address
}

// podRuntime is the node agent as the node endpoint sees it: the pods it
// runs, reachable for port-forward, and their logs.
type podRuntime interface {
	HasPod(ns, name string) (types.UID, bool)
	DialPod(ctx context.Context, ns, name string, uid types.UID, port int32) (net.Conn, error)
	ServeContainerLogs(w http.ResponseWriter, r *http.Request, ns, pod, container string)
}

// nodeEndpoint plays the kubelet's HTTPS server: port-forward and container
// logs. The streaming protocol handling (SPDY and WebSocket, stream pairing,
// error streams) is the kubelet's own code from k8s.io/cri-streaming; only
// the container runtime's part — connecting to the port inside the pod — is
// replaced: by dialing into the pod's network namespace for pods the node
// agent runs, by dialing a local address for hand-run pods (RunPod).
type nodeEndpoint struct {
	ctx    context.Context // cancelled by stop; bounds dials to targets
	cancel context.CancelFunc

	srv      *http.Server
	listener net.Listener
	port     int

	mu       sync.Mutex
	runtime  podRuntime // the node agent; nil until it started
	pods     map[podKey]*podEntry
	forwards map[*forwardedConn]struct{} // live forwarded connections
	rawConns map[net.Conn]struct{}       // every accepted TCP conn, hijacked or not
	stopped  bool

	serveDone chan struct{}  // closed when srv.Serve returns
	handlers  sync.WaitGroup // running servePortForward calls
	copiers   sync.WaitGroup // running copy goroutines of forwarded connections
}

// forwardedConn is one port-forward stream pair bridged to one TCP
// connection to the target.
type forwardedConn struct {
	target  net.Conn
	mu      sync.Mutex
	dropped bool
}

// startNodeEndpoint serves the kubelet's port-forward paths over HTTPS on a
// free loopback port. Only HTTP/1.1 is offered: the API server's upgrade
// proxy needs a connection it can hijack, which HTTP/2 does not give.
func startNodeEndpoint(serving *keyPair, clientCA *x509.Certificate) (*nodeEndpoint, error) {
	cert, err := tls.X509KeyPair(serving.certPEM, serving.keyPEM)
	if err != nil {
		return nil, fmt.Errorf("node endpoint serving cert: %w", err)
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(clientCA)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("node endpoint listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &nodeEndpoint{
		ctx:       ctx,
		cancel:    cancel,
		port:      ln.Addr().(*net.TCPAddr).Port,
		pods:      make(map[podKey]*podEntry),
		forwards:  make(map[*forwardedConn]struct{}),
		rawConns:  make(map[net.Conn]struct{}),
		serveDone: make(chan struct{}),
	}
	n.listener = &trackingListener{Listener: ln, n: n}

	mux := http.NewServeMux()
	mux.HandleFunc("/portForward/{namespace}/{pod}", n.servePortForward)
	mux.HandleFunc("/portForward/{namespace}/{pod}/{uid}", n.servePortForward)
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", n.serveContainerLogs)
	n.srv = &http.Server{
		Handler: mux,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			// The kubelet only trusts the apiserver's client certificate.
			ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs:  clientCAs,
			NextProtos: []string{"http/1.1"},
			MinVersion: tls.VersionTLS12,
		},
		// A non-nil empty map turns HTTP/2 off.
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          nil,
	}
	go func() {
		defer close(n.serveDone)
		// ServeTLS returns http.ErrServerClosed after Close; any other error
		// means the listener broke, which stop() handles the same way.
		_ = n.srv.ServeTLS(n.listener, "", "")
	}()
	return n, nil
}

// servePortForward is the kubelet's getPortForward: check the pod exists
// (and has the UID asked for, if any), then hand the request to the
// upstream streaming code.
func (n *nodeEndpoint) servePortForward(w http.ResponseWriter, r *http.Request) {
	// Counted under the lock that stop() takes, so no Add races its Wait.
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		http.Error(w, "node endpoint is stopping", http.StatusServiceUnavailable)
		return
	}
	n.handlers.Add(1)
	n.mu.Unlock()
	defer n.handlers.Done()

	ns, name, uid := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("uid")
	podUID, ok := n.lookupPod(ns, name)
	if !ok {
		http.Error(w, "pod does not exist", http.StatusNotFound)
		return
	}
	if uid != "" && types.UID(uid) != podUID {
		http.Error(w, "pod not found", http.StatusNotFound)
		return
	}
	// The WebSocket protocol names the ports in the query; SPDY names them
	// per stream. NewV4Options returns empty options for SPDY.
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fwd := &podForwarder{n: n, namespace: ns}
	portforward.ServePortForward(w, r, fwd, name, string(podUID), opts,
		streamIdleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

// lookupPod finds a pod on the node: hand-run first, then the agent's.
func (n *nodeEndpoint) lookupPod(ns, name string) (types.UID, bool) {
	n.mu.Lock()
	entry, ok := n.pods[podKey{ns, name}]
	rt := n.runtime
	n.mu.Unlock()
	if ok {
		return entry.uid, true
	}
	if rt != nil {
		return rt.HasPod(ns, name)
	}
	return "", false
}

// serveContainerLogs is the kubelet's /containerLogs, which `kubectl logs`
// reaches through the API server.
func (n *nodeEndpoint) serveContainerLogs(w http.ResponseWriter, r *http.Request) {
	ns, name, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	n.mu.Lock()
	_, handRun := n.pods[podKey{ns, name}]
	rt := n.runtime
	n.mu.Unlock()
	switch {
	case handRun:
		http.Error(w, fmt.Sprintf("pod %q is run by the test itself (sandbox RunPod); its logs are not collected", name), http.StatusBadRequest)
	case rt != nil:
		rt.ServeContainerLogs(w, r, ns, name, container)
	default:
		http.Error(w, fmt.Sprintf("pod %q does not exist", name), http.StatusNotFound)
	}
}

func (n *nodeEndpoint) setRuntime(rt podRuntime) {
	n.mu.Lock()
	n.runtime = rt
	n.mu.Unlock()
}

// handRunTarget maps a hand-run pod's IP and port to its process's
// address, for Service traffic the node agent proxies.
func (n *nodeEndpoint) handRunTarget(ip netip.Addr, port int32) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.pods {
		if e.ip == ip {
			addr, ok := e.targets[port]
			return addr, ok
		}
	}
	return "", false
}

// podForwarder is the runtime side of one port-forward request.
type podForwarder struct {
	n         *nodeEndpoint
	namespace string
}

// PortForward connects one forwarded stream to the pod's target for port.
// It is called once per forwarded connection and returns when either side is
// done; returning an error makes the streaming code report it on the error
// stream and reset the pair.
func (f *podForwarder) PortForward(_ context.Context, name, uid string, port int32, stream io.ReadWriteCloser) error {
	n := f.n
	dialCtx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	target, addr, err := n.dialPod(dialCtx, f.namespace, name, types.UID(uid), port)
	cancel()
	if err != nil {
		return err
	}
	fc := &forwardedConn{target: target}
	if !n.addForward(fc) {
		target.Close()
		return errors.New("node endpoint is stopping")
	}
	defer n.removeForward(fc)
	defer target.Close()

	// Copy both ways the way containerd's CRI PortForward does (the
	// runtime a real kubelet hands port-forwards to): when one direction
	// ends, give the other one second to finish, then tear the whole
	// forwarded connection down. So a client that half-closes its side must
	// not expect a long reply — as on a real node.
	errCh := make(chan error, 2)
	go func() {
		defer n.copiers.Done()
		_, err := io.Copy(stream, target)
		errCh <- err
	}()
	// This one can outlive PortForward: a SPDY stream's Read only ends when
	// the client resets the stream (client-go does, once the target side
	// is done) or the connection closes. stop() closes every connection and
	// then waits for n.copiers, so it never outlives the sandbox.
	go func() {
		defer n.copiers.Done()
		_, err := io.Copy(target, stream)
		errCh <- err
	}()

	var errFwd error
	select {
	case errFwd = <-errCh:
	case <-n.ctx.Done():
		return errors.New("node endpoint stopped")
	}
	if fc.wasDropped() {
		return errDropped
	}
	select {
	case err := <-errCh:
		if errFwd == nil {
			errFwd = err
		}
	case <-time.After(time.Second):
	case <-n.ctx.Done():
	}
	if fc.wasDropped() {
		return errDropped
	}
	if errFwd != nil && !errors.Is(errFwd, net.ErrClosed) {
		return fmt.Errorf("forwarding to %s: %w", addr, errFwd)
	}
	return nil
}

// dialPod connects to a pod's port: a hand-run pod's target address, or
// 127.0.0.1:port inside the network namespace of a pod the agent runs.
// addr names the target for error messages.
func (n *nodeEndpoint) dialPod(ctx context.Context, ns, name string, uid types.UID, port int32) (net.Conn, string, error) {
	n.mu.Lock()
	entry, handRun := n.pods[podKey{ns, name}]
	rt := n.runtime
	n.mu.Unlock()
	if !handRun {
		if rt == nil {
			return nil, "", fmt.Errorf("pod %s/%s (uid %s) is gone", ns, name, uid)
		}
		c, err := rt.DialPod(ctx, ns, name, uid, port)
		return c, fmt.Sprintf("port %d of pod %s/%s", port, ns, name), err
	}
	if entry.uid != uid {
		return nil, "", fmt.Errorf("pod %s/%s (uid %s) is gone", ns, name, uid)
	}
	addr, ok := entry.targets[port]
	if !ok {
		// What a container runtime says when nothing listens on the port.
		return nil, "", fmt.Errorf("failed to connect to localhost:%d inside namespace of pod %s/%s: connection refused", port, ns, name)
	}
	var d net.Dialer
	target, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("failed to connect to localhost:%d inside namespace of pod %s/%s: %w", port, ns, name, err)
	}
	return target, addr, nil
}

func (fc *forwardedConn) wasDropped() bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.dropped
}

func (n *nodeEndpoint) addForward(fc *forwardedConn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return false
	}
	n.forwards[fc] = struct{}{}
	// The two copy goroutines are counted here, under the lock stop()
	// takes, so no Add races its Wait.
	n.copiers.Add(2)
	return true
}

func (n *nodeEndpoint) removeForward(fc *forwardedConn) {
	n.mu.Lock()
	delete(n.forwards, fc)
	n.mu.Unlock()
}

// dropAll closes the target side of every live forwarded connection and
// returns how many there were. Each one then ends with an error on its
// port-forward error stream, which client-go treats as a lost connection.
func (n *nodeEndpoint) dropAll() int {
	n.mu.Lock()
	live := make([]*forwardedConn, 0, len(n.forwards))
	for fc := range n.forwards {
		live = append(live, fc)
		delete(n.forwards, fc)
	}
	n.mu.Unlock()
	for _, fc := range live {
		fc.mu.Lock()
		fc.dropped = true
		fc.mu.Unlock()
		fc.target.Close()
	}
	return len(live)
}

func (n *nodeEndpoint) setPod(ns, name string, uid types.UID, ip netip.Addr, targets map[int32]string) {
	copied := make(map[int32]string, len(targets))
	for p, a := range targets {
		copied[p] = a
	}
	n.mu.Lock()
	n.pods[podKey{ns, name}] = &podEntry{uid: uid, ip: ip, targets: copied}
	n.mu.Unlock()
}

// deletePod forgets a hand-run pod and returns its IP (invalid if unknown).
func (n *nodeEndpoint) deletePod(ns, name string) netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.pods[podKey{ns, name}]
	if !ok {
		return netip.Addr{}
	}
	delete(n.pods, podKey{ns, name})
	return e.ip
}

// podIP is a hand-run pod's IP.
func (n *nodeEndpoint) podIP(ns, name string) (netip.Addr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.pods[podKey{ns, name}]
	if !ok {
		return netip.Addr{}, false
	}
	return e.ip, true
}

// stop closes the listener and every connection, hijacked ones included
// (http.Server.Close does not touch those), then waits for the handlers.
func (n *nodeEndpoint) stop() {
	n.mu.Lock()
	n.stopped = true
	n.mu.Unlock()
	n.cancel()
	_ = n.srv.Close()
	n.dropAll()
	n.mu.Lock()
	conns := make([]net.Conn, 0, len(n.rawConns))
	for c := range n.rawConns {
		conns = append(conns, c)
	}
	n.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	<-n.serveDone
	// Every handler's connection is closed now, so each returns promptly;
	// the bound only guards against a bug turning Stop into a hang.
	done := make(chan struct{})
	go func() {
		n.handlers.Wait()
		n.copiers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// trackingListener records every accepted connection until it is closed, so
// stop() can close hijacked (upgraded) connections too.
type trackingListener struct {
	net.Listener
	n *nodeEndpoint
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, n: l.n}
	l.n.mu.Lock()
	stopped := l.n.stopped
	if !stopped {
		l.n.rawConns[tc] = struct{}{}
	}
	l.n.mu.Unlock()
	if stopped {
		c.Close()
		return nil, net.ErrClosed
	}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	n    *nodeEndpoint
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.n.mu.Lock()
		delete(c.n.rawConns, c)
		c.n.mu.Unlock()
	})
	return c.Conn.Close()
}

// liveForwards counts live forwarded connections.
func (n *nodeEndpoint) liveForwards() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.forwards)
}
