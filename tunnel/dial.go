package tunnel

import (
	"context"
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

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/util/flowcontrol"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// Dialer opens port-forward tunnels to the server. It is safe for
// concurrent use; every Dial resolves the pod again, so after the pod is
// replaced the next connection reaches the new one.
type Dialer struct {
	config *rest.Config
	client apiClient
	target Target
	// websockets selects the WebSocket dialer with SPDY fallback; false
	// forces SPDY, as KUBECTL_PORT_FORWARD_WEBSOCKETS=false does for kubectl.
	websockets bool
	requestID  atomic.Int64
	// Trace, when set, is called as each phase of a dial ends (see the
	// plugin's KUBECTL_ETCDBACKUP_TRACE, built with -tags etcdbackup_trace).
	Trace func(phase string)
	// Resolved, when set, is told each endpoint a dial resolves, e.g. to
	// remember it as the next run's Hint.
	Resolved func(*Endpoint)
	hint     atomic.Pointer[Hint]
	// broken are the pods whose tunnels broke lately, and when: Resolve
	// prefers another ready replica (replicas.go).
	brokenMu sync.Mutex
	broken   map[types.UID]time.Time
	// now is the clock of broken; nil is time.Now.
	now func() time.Time
	// dialerFor is streamDialer; tests replace it.
	dialerFor func(pod *corev1.Pod) (streamhttp.Dialer, error)
}

func (d *Dialer) trace(phase string) {
	if d.Trace != nil {
		d.Trace(phase)
	}
}

// apiClient is the part of a clientset a Dialer uses: pods and Services
// to resolve the server, and the SelfSubjectAccessReview that explains a
// refused port-forward. kubernetes.Interface (a fake one in tests) has it.
type apiClient interface {
	CoreV1() corev1client.CoreV1Interface
	AuthorizationV1() authorizationv1client.AuthorizationV1Interface
}

// typedClients are the two API groups' clients, sharing one HTTP client
// (one connection to the API server). A whole clientset would build a
// client for each of the API server's fifty-odd group versions, and link
// them all into the plugin.
type typedClients struct {
	core  corev1client.CoreV1Interface
	authz authorizationv1client.AuthorizationV1Interface
}

func (c *typedClients) CoreV1() corev1client.CoreV1Interface { return c.core }
func (c *typedClients) AuthorizationV1() authorizationv1client.AuthorizationV1Interface {
	return c.authz
}

// New returns a Dialer for target using config's credentials.
func New(config *rest.Config, target Target) (*Dialer, error) {
	// What kubernetes.NewForConfig does for its clients: the default
	// user agent, one HTTP client and one rate limiter for both.
	c := *config
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("kubernetes client: burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	core, err := corev1client.NewForConfigAndClient(&c, httpClient)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	authz, err := authorizationv1client.NewForConfigAndClient(&c, httpClient)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return newDialer(config, &typedClients{core: core, authz: authz}, target), nil
}

// newDialer is New with the API client given, so resolution and error
// explanation can be tested against a fake clientset. config still
// carries the credentials and address the port-forward dialers use.
func newDialer(config *rest.Config, client apiClient, target Target) *Dialer {
	if target.PortName == "" {
		target.PortName = DefaultPortName
	}
	d := &Dialer{
		config:     config,
		client:     client,
		target:     target,
		websockets: !strings.EqualFold(os.Getenv("KUBECTL_PORT_FORWARD_WEBSOCKETS"), "false"),
	}
	d.dialerFor = d.streamDialer
	return d
}

// DialContext resolves the server pod and opens a port-forward to it. Its
// signature fits grpc.WithContextDialer; the address is ignored.
func (d *Dialer) DialContext(ctx context.Context, _ string) (net.Conn, error) {
	if h := d.hint.Swap(nil); h != nil {
		return d.dialHinted(ctx, h)
	}
	ep, err := d.resolve(ctx)
	if err != nil {
		return nil, err
	}
	return d.DialEndpoint(ctx, ep)
}

// resolve is Resolve, telling Resolved what it found.
func (d *Dialer) resolve(ctx context.Context) (*Endpoint, error) {
	ep, err := d.Resolve(ctx)
	if err == nil && d.Resolved != nil {
		d.Resolved(ep)
	}
	return ep, err
}

// DialEndpoint opens a port-forward to ep.
func (d *Dialer) DialEndpoint(ctx context.Context, ep *Endpoint) (net.Conn, error) {
	dialer, err := d.dialerFor(ep.Pod)
	if err != nil {
		return nil, err
	}
	sc, err := d.upgrade(ctx, dialer)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		d.markBroken(ep.Pod)
		return nil, d.portForwardError(ctx, ep, err)
	}
	return d.streams(sc, ep)
}

// upgrade opens a port-forward connection with dialer: the API server's
// upgrade to WebSocket or SPDY, through to the kubelet. Nothing reaches
// the pod until streams are created on it.
func (d *Dialer) upgrade(ctx context.Context, dialer streamhttp.Dialer) (streamhttp.Connection, error) {
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
	select {
	case r := <-done:
		if r.err == nil {
			d.trace("port-forward upgraded")
		}
		return r.conn, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// streams opens the forwarded connection's streams on sc, closing sc if
// that fails.
func (d *Dialer) streams(sc streamhttp.Connection, ep *Endpoint) (net.Conn, error) {
	conn, err := d.openStreams(sc, ep)
	if err != nil {
		sc.Close()
		return nil, err
	}
	d.trace("port-forward streams created")
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
	headers := func(streamType string) http.Header {
		h := http.Header{}
		h.Set(corev1.StreamType, streamType)
		h.Set(corev1.PortHeader, strconv.Itoa(int(ep.Port)))
		h.Set(corev1.PortForwardRequestIDHeader, id)
		return h
	}
	// Each CreateStream waits for the kubelet's reply: the two are created
	// at once, so that costs one round trip, not two. The kubelet pairs
	// them by request ID, whichever comes first.
	var errorStream streamhttp.Stream
	var errorErr error
	created := make(chan struct{})
	go func() {
		defer close(created)
		errorStream, errorErr = sc.CreateStream(headers(corev1.StreamTypeError))
	}()
	dataStream, err := sc.CreateStream(headers(corev1.StreamTypeData))
	<-created
	if errorErr != nil {
		if dataStream != nil {
			dataStream.Reset()
		}
		return nil, fmt.Errorf("port-forward to %s: create error stream: %w", ep, errorErr)
	}
	// Nothing is written to the error stream.
	errorStream.Close()
	if err != nil {
		return nil, fmt.Errorf("port-forward to %s: create data stream: %w", ep, err)
	}
	c := &Conn{sc: sc, data: dataStream, endpoint: ep, closed: make(chan struct{}),
		broke: func() { d.markBroken(ep.Pod) }}
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

// portForwardError explains a failed port-forward. An upgrade refused with
// 403 is almost always RBAC; confirm with a SelfSubjectAccessReview so the
// message names exactly what is missing.
func (d *Dialer) portForwardError(ctx context.Context, ep *Endpoint, err error) error {
	if allowed, known := d.canPortForward(ctx, ep.Pod.Namespace); known && !allowed {
		return newPortForwardForbidden(ep, err)
	}
	return apiError(d.config.Host, "port-forward to "+ep.String(), err)
}

// canPortForward asks the API server whether the caller may create
// pods/portforward in ns. known is false when the question itself failed.
func (d *Dialer) canPortForward(ctx context.Context, ns string) (allowed, known bool) {
	r, err := d.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: "create", Resource: "pods", Subresource: "portforward",
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, false
	}
	return r.Status.Allowed, true
}
