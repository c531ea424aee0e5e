//go:build linux

package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

type probeKind int

const (
	probeReadiness probeKind = iota
	probeLiveness
	probeStartup
)

func (k probeKind) String() string {
	return [...]string{"Readiness", "Liveness", "Startup"}[k]
}

// probeUserAgent is what the kubelet's probes send.
const probeUserAgent = "kube-probe/1.37"

// fastProbeInterval is how often a readiness or startup probe runs until
// it first succeeds. A kubelet waits periodSeconds between attempts, so a
// Pod whose server listens 50 ms after start is Ready only after a full
// period; the sandbox probes faster until then so tests and `make sandbox`
// do not wait on it. Afterwards periodSeconds and the thresholds apply as
// in the kubelet.
const fastProbeInterval = 200 * time.Millisecond

// startProbes runs the container's probes until ctx ends (the run exits or
// the agent stops). Readiness and liveness wait for the startup probe.
func (w *podWorker) startProbes(ctx context.Context, pod *corev1.Pod, cs *containerState, run *containerRun) {
	c := cs.spec
	ns := w.ns
	started := make(chan struct{})
	if c.StartupProbe == nil {
		close(started)
	}
	launch := func(kind probeKind, p *corev1.Probe) {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.probeLoop(ctx, kind, p, &c, run, ns, started)
		}()
	}
	if c.StartupProbe != nil {
		launch(probeStartup, c.StartupProbe)
	}
	if c.ReadinessProbe != nil {
		launch(probeReadiness, c.ReadinessProbe)
	}
	if c.LivenessProbe != nil {
		launch(probeLiveness, c.LivenessProbe)
	}
}

func seconds(v int32, def int) time.Duration {
	if v <= 0 {
		return time.Duration(def) * time.Second
	}
	return time.Duration(v) * time.Second
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// probeLoop is one prober worker: it reports a result to the pod worker
// whenever the thresholds flip it.
func (w *podWorker) probeLoop(ctx context.Context, kind probeKind, p *corev1.Probe, c *corev1.Container, run *containerRun, ns *netNS, started chan struct{}) {
	if kind != probeStartup {
		select {
		case <-started:
		case <-ctx.Done():
			return
		}
	}
	period := seconds(p.PeriodSeconds, 10)
	delay := time.Duration(p.InitialDelaySeconds) * time.Second
	if kind == probeLiveness && delay == 0 {
		// A liveness probe at the very start only fails (the process is not
		// listening yet) and, with failureThreshold > 1, changes nothing but
		// an Unhealthy event; the first one waits a period.
		delay = period
	}
	if wait := time.Until(run.startedAt.Add(delay)); wait > 0 && !sleepCtx(ctx, wait) {
		return
	}
	timeout := seconds(p.TimeoutSeconds, 1)
	successThreshold, failureThreshold := int(p.SuccessThreshold), int(p.FailureThreshold)
	if successThreshold <= 0 {
		successThreshold = 1
	}
	if failureThreshold <= 0 {
		failureThreshold = 3
	}
	// Initial results, as the kubelet's: alive until proven otherwise, not
	// ready and not started until a probe succeeds.
	result := kind == probeLiveness
	succeededOnce := false
	okRun, failRun := 0, 0
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := probeOnce(pctx, p, c, ns)
		cancel()
		if ctx.Err() != nil {
			return
		}
		fast := !succeededOnce && kind != probeLiveness
		if err == nil {
			okRun, failRun = okRun+1, 0
			succeededOnce = true
		} else {
			okRun, failRun = 0, failRun+1
			if !fast {
				w.a.recorder.Eventf(w.currentPod(), corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
			}
		}
		next := result
		if okRun >= successThreshold {
			next = true
		}
		if failRun >= failureThreshold {
			next = false
		}
		if next != result {
			result = next
			w.post(evProbe{name: c.Name, runID: run.id, kind: kind, ok: result})
			if kind == probeStartup && result {
				close(started)
				return
			}
			if kind == probeLiveness && !result {
				return // the container is being killed; its next run probes anew
			}
		}
		interval := period
		if !succeededOnce && kind != probeLiveness {
			interval = min(period, fastProbeInterval)
		}
		if !sleepCtx(ctx, interval) {
			return
		}
	}
}

// probeOnce runs a probe once against the container, from inside the Pod's
// network namespace at 127.0.0.1 (the node reaches Pods there, never at the
// Pod IP).
func probeOnce(ctx context.Context, p *corev1.Probe, c *corev1.Container, ns *netNS) error {
	switch {
	case p.GRPC != nil:
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(p.GRPC.Port)))
		return grpcProbe(ctx, ns, addr, ptrString(p.GRPC.Service))
	case p.TCPSocket != nil:
		port, err := resolvePort(p.TCPSocket.Port, c)
		if err != nil {
			return err
		}
		conn, err := ns.Dial(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case p.HTTPGet != nil:
		return httpProbe(ctx, ns, p.HTTPGet, c)
	case p.Exec != nil:
		return errors.New("exec probes are not supported by the sandbox node agent")
	}
	return errors.New("probe has no handler")
}

func resolvePort(port intstr.IntOrString, c *corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container has no port named %q", port.StrVal)
}

// grpcProbe is the kubelet's gRPC probe: grpc.health.v1 Check must answer
// SERVING.
func grpcProbe(ctx context.Context, ns *netNS, addr, service string) error {
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return ns.Dial(ctx, "tcp", a) }),
		grpc.WithUserAgent(probeUserAgent))
	if err != nil {
		return fmt.Errorf("failed to connect service %q: %w", addr, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("failed to check service %q: %w", addr, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("service unhealthy (responded with %q)", resp.GetStatus())
	}
	return nil
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// httpProbe succeeds on a 2xx or 3xx answer; redirects are not followed.
func httpProbe(ctx context.Context, ns *netNS, g *corev1.HTTPGetAction, c *corev1.Container) error {
	port, err := resolvePort(g.Port, c)
	if err != nil {
		return err
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: g.Path}
	if u.Path == "" {
		u.Path = "/"
	}
	tr := &http.Transport{
		DialContext:       ns.Dial,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the kubelet: probes do not verify certificates
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", probeUserAgent)
	for _, h := range g.HTTPHeaders {
		if h.Name == "Host" {
			req.Host = h.Value
			continue
		}
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

// livenessGrace is how long a container failing its liveness probe gets
// after SIGTERM.
func livenessGrace(pod *corev1.Pod, p *corev1.Probe) time.Duration {
	if p != nil && p.TerminationGracePeriodSeconds != nil {
		return time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
	}
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}
