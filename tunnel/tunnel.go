// Package tunnel connects to the etcdbackup data server through the
// Kubernetes API server: it finds a Ready pod behind the server's Service,
// opens a port-forward to its "grpc" port with client-go's own dialers
// (WebSocket first, SPDY as fallback, as kubectl does) and hands each
// forwarded stream to gRPC as a net.Conn. No local port is ever listened
// on, so nothing else on the machine can reach the tunnel.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// DefaultPortName is the name of the server's gRPC port on its Service
// and container.
const DefaultPortName = "grpc"

// Target names the server to reach.
type Target struct {
	Namespace string
	Service   string
	// PortName is the Service port (and container port) to forward to.
	PortName string
}

// Dialer opens port-forward tunnels to the server. It is safe for
// concurrent use; every Dial resolves the pod again, so after the pod is
// replaced the next connection reaches the new one.
type Dialer struct {
	config *rest.Config
	client kubernetes.Interface
	target Target
	// websockets selects the WebSocket dialer with SPDY fallback; false
	// forces SPDY, as KUBECTL_PORT_FORWARD_WEBSOCKETS=false does for kubectl.
	websockets bool
	requestID  atomic.Int64
}

// New returns a Dialer for target using config's credentials.
func New(config *rest.Config, target Target) (*Dialer, error) {
	if target.PortName == "" {
		target.PortName = DefaultPortName
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &Dialer{
		config:     config,
		client:     client,
		target:     target,
		websockets: !strings.EqualFold(os.Getenv("KUBECTL_PORT_FORWARD_WEBSOCKETS"), "false"),
	}, nil
}

// Endpoint is the pod and port a tunnel leads to.
type Endpoint struct {
	Pod  *corev1.Pod
	Port int32
}

func (e *Endpoint) String() string {
	return fmt.Sprintf("pod %s/%s port %d", e.Pod.Namespace, e.Pod.Name, e.Port)
}

// Resolve finds a Running and Ready pod behind the Service and the
// container port the Service's port leads to.
func (d *Dialer) Resolve(ctx context.Context) (*Endpoint, error) {
	t := d.target
	svc, err := d.client.CoreV1().Services(t.Namespace).Get(ctx, t.Service, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &NotInstalledError{Namespace: t.Namespace, Service: t.Service}
	}
	if err != nil {
		return nil, d.apiError(fmt.Sprintf("get service %s/%s", t.Namespace, t.Service), err)
	}
	svcPort, err := servicePort(svc, t.PortName)
	if err != nil {
		return nil, err
	}
	if len(svc.Spec.Selector) == 0 {
		return nil, fmt.Errorf("service %s/%s has no selector, so no server pod can be found behind it", t.Namespace, t.Service)
	}
	pods, err := d.client.CoreV1().Pods(t.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(svc.Spec.Selector).String(),
	})
	if err != nil {
		return nil, d.apiError(fmt.Sprintf("list pods of service %s/%s", t.Namespace, t.Service), err)
	}
	var notReady []corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase == corev1.PodRunning && podReady(p) {
			port, err := containerPort(p, svcPort.TargetPort, svcPort.Port)
			if err != nil {
				return nil, err
			}
			return &Endpoint{Pod: p, Port: port}, nil
		}
		notReady = append(notReady, *p)
	}
	return nil, &NotReadyError{Namespace: t.Namespace, Service: t.Service, Pods: notReady}
}

func servicePort(svc *corev1.Service, name string) (*corev1.ServicePort, error) {
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == name {
			return &svc.Spec.Ports[i], nil
		}
	}
	if len(svc.Spec.Ports) == 1 && svc.Spec.Ports[0].Name == "" {
		return &svc.Spec.Ports[0], nil
	}
	return nil, fmt.Errorf("service %s/%s has no port named %q; is it the etcdbackup server's Service?", svc.Namespace, svc.Name, name)
}

// containerPort resolves a Service targetPort against the pod, as the
// endpoints controller does.
func containerPort(p *corev1.Pod, target intstr.IntOrString, servicePort int32) (int32, error) {
	switch {
	case target.Type == intstr.String && target.StrVal != "":
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == target.StrVal {
					return cp.ContainerPort, nil
				}
			}
		}
		return 0, fmt.Errorf("pod %s/%s has no container port named %q", p.Namespace, p.Name, target.StrVal)
	case target.Type == intstr.Int && target.IntVal != 0:
		return target.IntVal, nil
	}
	return servicePort, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// DialContext resolves the server pod and opens a port-forward to it. Its
// signature fits grpc.WithContextDialer; the address is ignored.
func (d *Dialer) DialContext(ctx context.Context, _ string) (net.Conn, error) {
	ep, err := d.Resolve(ctx)
	if err != nil {
		return nil, err
	}
	return d.DialEndpoint(ctx, ep)
}

// DialEndpoint opens a port-forward to ep.
func (d *Dialer) DialEndpoint(ctx context.Context, ep *Endpoint) (net.Conn, error) {
	dialer, err := d.streamDialer(ep.Pod)
	if err != nil {
		return nil, err
	}
	type result struct {
		conn streamhttp.Connection
		err  error
	}
	// client-go's Dial takes no context: run it aside so ctx still bounds
	// how long we wait, and close a connection that arrives too late.
	done := make(chan result, 1)
	go func() {
		c, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		done <- result{c, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, d.portForwardError(ctx, ep, r.err)
	}
	conn, err := d.openStreams(r.conn, ep)
	if err != nil {
		r.conn.Close()
		return nil, err
	}
	return conn, nil
}

func (d *Dialer) streamDialer(pod *corev1.Pod) (streamhttp.Dialer, error) {
	u := d.client.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(d.config)
	if err != nil {
		return nil, fmt.Errorf("port-forward transport: %w", err)
	}
	dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	if !d.websockets {
		return dialer, nil
	}
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, d.config)
	if err != nil {
		return nil, fmt.Errorf("port-forward websocket dialer: %w", err)
	}
	// Exactly kubectl's choice: WebSocket first, SPDY when the server
	// cannot upgrade to it (older API servers, proxies).
	return portforward.NewFallbackDialerForStreaming(ws, dialer, func(err error) bool {
		return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
	}), nil
}

// openStreams creates the error and data streams of one forwarded
// connection, as client-go's PortForwarder does for each local connection.
func (d *Dialer) openStreams(sc streamhttp.Connection, ep *Endpoint) (*Conn, error) {
	id := strconv.FormatInt(d.requestID.Add(1), 10)
	headers := http.Header{}
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	headers.Set(corev1.PortHeader, strconv.Itoa(int(ep.Port)))
	headers.Set(corev1.PortForwardRequestIDHeader, id)
	errorStream, err := sc.CreateStream(headers)
	if err != nil {
		return nil, fmt.Errorf("port-forward to %s: create error stream: %w", ep, err)
	}
	// Nothing is written to the error stream.
	errorStream.Close()
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	dataStream, err := sc.CreateStream(headers)
	if err != nil {
		return nil, fmt.Errorf("port-forward to %s: create data stream: %w", ep, err)
	}
	c := &Conn{sc: sc, data: dataStream, endpoint: ep, closed: make(chan struct{})}
	// The error stream carries the kubelet's complaint (e.g. nothing
	// listens on the port). When one comes, the tunnel is useless: close
	// it so gRPC sees the failure and re-dials.
	go func() {
		msg, err := io.ReadAll(errorStream)
		switch {
		case len(msg) > 0:
			c.fail(fmt.Errorf("port-forward to %s: %s", ep, strings.TrimSpace(string(msg))))
		case err != nil:
			c.fail(fmt.Errorf("port-forward to %s: error stream: %w", ep, err))
		}
	}()
	go func() {
		select {
		case <-sc.CloseChan():
			c.fail(fmt.Errorf("port-forward to %s: connection to the API server closed", ep))
		case <-c.closed:
		}
	}()
	return c, nil
}

// Conn is one forwarded stream as a net.Conn.
type Conn struct {
	sc       streamhttp.Connection
	data     streamhttp.Stream
	endpoint *Endpoint

	once   sync.Once
	closed chan struct{}
	mu     sync.Mutex
	err    error
}

var _ net.Conn = (*Conn)(nil)

// Endpoint returns the pod and port this connection leads to.
func (c *Conn) Endpoint() *Endpoint { return c.endpoint }

func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.data.Read(p)
	if err != nil {
		if cause := c.cause(); cause != nil {
			return n, cause
		}
	}
	return n, err
}

func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.data.Write(p)
	if err != nil {
		if cause := c.cause(); cause != nil {
			return n, cause
		}
	}
	return n, err
}

func (c *Conn) cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.Close()
}

// Close tears down the forwarded stream and its connection to the API
// server.
func (c *Conn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		_ = c.data.Reset()
		_ = c.sc.Close()
	})
	return nil
}

// LocalAddr implements net.Conn with a placeholder: there is no socket.
func (c *Conn) LocalAddr() net.Addr { return tunnelAddr("local") }

// RemoteAddr implements net.Conn, naming the pod and port.
func (c *Conn) RemoteAddr() net.Addr { return tunnelAddr(c.endpoint.String()) }

// SetDeadline is not supported by port-forward streams; gRPC does not need
// it (its keepalive pings find a dead tunnel).
func (c *Conn) SetDeadline(time.Time) error      { return nil }
func (c *Conn) SetReadDeadline(time.Time) error  { return nil }
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }

type tunnelAddr string

func (a tunnelAddr) Network() string { return "portforward" }
func (a tunnelAddr) String() string  { return string(a) }

// apiError explains a failed API call.
func (d *Dialer) apiError(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return &ForbiddenError{Action: what, Err: err}
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: the API server did not accept your credentials (%v); check your kubeconfig with `kubectl auth whoami`", what, err)
	}
	var netErr net.Error
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.As(err, &netErr) || errors.Is(err, io.EOF) {
		return &UnreachableError{Host: d.config.Host, Err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// portForwardError explains a failed port-forward. An upgrade refused with
// 403 is almost always RBAC; confirm with a SelfSubjectAccessReview so the
// message names exactly what is missing.
func (d *Dialer) portForwardError(ctx context.Context, ep *Endpoint, err error) error {
	if allowed, known := d.canPortForward(ctx, ep.Pod.Namespace); known && !allowed {
		return &ForbiddenError{Action: "port-forward to " + ep.String(), Verb: "create", Resource: "pods/portforward", Namespace: ep.Pod.Namespace, Err: err}
	}
	return d.apiError("port-forward to "+ep.String(), err)
}
