package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox/nodeagent"
)

const (
	testNS      = "etcdbackup-system"
	testPod     = "etcdbackup-server-7d9f-abcde"
	grpcPort    = 7443
	ioTimeout   = 10 * time.Second
	payloadSize = 256 << 10
)

// TestSandbox brings up the sandbox once and checks, through real clients
// only, that it behaves like a cluster for what the plugin needs.
func TestSandbox(t *testing.T) {
	began := time.Now()
	s := sandbox.StartForTest(t)
	t.Logf("sandbox started in %s", time.Since(began).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	echoAddr := startEchoServer(t)
	if err := s.RunPod(ctx, sandbox.PodSpec{
		Namespace: testNS,
		Name:      testPod,
		Labels:    map[string]string{"app.kubernetes.io/name": "etcdbackup-server"},
		Ports:     []corev1.ContainerPort{{Name: "grpc", ContainerPort: grpcPort, Protocol: corev1.ProtocolTCP}},
		Targets:   map[int32]string{grpcPort: echoAddr},
		Ready:     true,
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateService(ctx, testNS, "etcdbackup-server",
		map[string]string{"app.kubernetes.io/name": "etcdbackup-server"},
		[]corev1.ServicePort{{Name: "grpc", Port: grpcPort}}); err != nil {
		t.Fatal(err)
	}

	t.Run("pod-status", func(t *testing.T) {
		pod, err := s.Client().CoreV1().Pods(testNS).Get(ctx, testPod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ip, err := netip.ParseAddr(pod.Status.PodIP); pod.Status.Phase != corev1.PodRunning || err != nil || !nodeagent.PodCIDR.Contains(ip) || pod.Spec.NodeName != sandbox.NodeName {
			t.Fatalf("pod: phase %s, IP %q, node %q", pod.Status.Phase, pod.Status.PodIP, pod.Spec.NodeName)
		}
		if !podReady(pod) {
			t.Fatal("pod not Ready")
		}
		if err := s.SetPodStatus(ctx, testNS, testPod, corev1.PodRunning, false); err != nil {
			t.Fatal(err)
		}
		pod, err = s.Client().CoreV1().Pods(testNS).Get(ctx, testPod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if podReady(pod) {
			t.Fatal("pod still Ready after SetPodStatus(ready=false)")
		}
		if err := s.SetPodStatus(ctx, testNS, testPod, corev1.PodRunning, true); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("forward-spdy", func(t *testing.T) {
		local, _ := forward(t, spdyDialer(t, s))
		echoRoundTrip(t, local)
	})

	t.Run("forward-websocket", func(t *testing.T) {
		// SPDY tunnelled over WebSocket, no fallback: proves the WebSocket
		// path itself works (the apiserver translates it to SPDY for the node).
		local, _ := forward(t, websocketDialer(t, s))
		echoRoundTrip(t, local)
	})

	t.Run("forward-fallback", func(t *testing.T) {
		// What kubectl does: WebSocket first, SPDY if the server refuses.
		d := portforward.NewFallbackDialerForStreaming(websocketDialer(t, s), spdyDialer(t, s), func(err error) bool {
			return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
		})
		local, _ := forward(t, d)
		echoRoundTrip(t, local)
	})

	t.Run("drop", func(t *testing.T) {
		// Let the forwarded connections of earlier subtests wind down.
		waitFor(t, "no live forwarded connections", func() bool { return s.ForwardedConnections() == 0 })
		local, forwardDone := forward(t, spdyDialer(t, s))
		conn := dial(t, local)
		echo(t, conn, []byte("before drop"))
		if n := s.ForwardedConnections(); n != 1 {
			t.Fatalf("live forwarded connections = %d, want 1", n)
		}
		if n := s.DropForwardedConnections(); n != 1 {
			t.Fatalf("DropForwardedConnections() = %d, want 1", n)
		}
		// The local side must see the break: EOF or an error, not a hang.
		_ = conn.SetDeadline(time.Now().Add(ioTimeout))
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		if err == nil {
			t.Fatalf("read after drop returned %q, want EOF or error", buf[:n])
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("read after drop timed out: the drop did not reach the client")
		}
		// client-go reports the error stream's message and ends the session.
		select {
		case err := <-forwardDone:
			t.Logf("port-forward session ended after drop: %v", err)
		case <-time.After(ioTimeout):
			t.Fatal("port-forward session still running 10s after drop")
		}
		if n := s.DropForwardedConnections(); n != 0 {
			t.Fatalf("second DropForwardedConnections() = %d, want 0", n)
		}
	})

	t.Run("kubectl-get-pods", func(t *testing.T) {
		out := kubectl(t, s, s.Kubeconfig(), "get", "pods", "-n", testNS, "-o", "name")
		if !strings.Contains(out, "pod/"+testPod) {
			t.Fatalf("kubectl get pods: %q does not list %s", out, testPod)
		}
		out = kubectl(t, s, s.Kubeconfig(), "get", "pods", "-n", testNS)
		if !regexp.MustCompile(testPod + `\s+1/1\s+Running`).MatchString(out) {
			t.Fatalf("kubectl get pods: want %s 1/1 Running in\n%s", testPod, out)
		}
	})

	t.Run("kubectl-version", func(t *testing.T) {
		out := kubectl(t, s, s.Kubeconfig(), "version")
		for _, want := range []string{"Client Version: v1.37.2", "Server Version: v1.37.2"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl version: missing %q in\n%s", want, out)
			}
		}
	})

	t.Run("kubectl-port-forward", func(t *testing.T) {
		local := kubectlPortForward(t, s, "pod/"+testPod)
		echoRoundTrip(t, local)
		// By Service too: kubectl resolves it to the pod by selector.
		local = kubectlPortForward(t, s, "svc/etcdbackup-server")
		echoRoundTrip(t, local)
	})

	t.Run("user-kubeconfig", func(t *testing.T) {
		kc, err := s.NewUserKubeconfig("alice", "etcdbackup-users")
		if err != nil {
			t.Fatal(err)
		}
		if out, err := kubectlErr(s, kc, "get", "pods", "-n", testNS); err == nil || !strings.Contains(out, "Forbidden") {
			t.Fatalf("alice without RBAC: err %v, output %q; want Forbidden", err, out)
		}
		// A Role of our own: the built-in aggregated ClusterRoles (view,
		// edit, admin) stay empty without kube-controller-manager's
		// clusterrole-aggregation controller.
		_, err = s.Client().RbacV1().Roles(testNS).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Client().RbacV1().RoleBindings(testNS).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "users-pod-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-reader"},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: "etcdbackup-users"}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "alice can list pods via her group", func() bool {
			out, err := kubectlErr(s, kc, "get", "pods", "-n", testNS, "-o", "name")
			return err == nil && strings.Contains(out, testPod)
		})
	})

	t.Run("stop", func(t *testing.T) {
		pid := s.APIServerPID()
		began := time.Now()
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("Stop took %s", time.Since(began).Round(time.Millisecond))
		if err := s.Stop(); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("kube-apiserver pid %d still exists after Stop (kill -0: %v)", pid, err)
		}
		if kids := childProcesses(t, "kube-apiserver"); len(kids) > 0 {
			t.Fatalf("kube-apiserver children left after Stop: %v", kids)
		}
		if _, err := http.Get(s.APIServerURL()); err == nil {
			t.Fatal("apiserver URL still answers after Stop")
		}
	})
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startEchoServer serves TCP echo on a loopback port until the test ends.
func startEchoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // listener closed by cleanup
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func spdyDialer(t *testing.T, s *sandbox.Sandbox) streamhttp.Dialer {
	t.Helper()
	cfg := s.RESTConfig()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := s.Client().CoreV1().RESTClient().Post().Resource("pods").Namespace(testNS).Name(testPod).SubResource("portforward").URL()
	return spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
}

func websocketDialer(t *testing.T, s *sandbox.Sandbox) streamhttp.Dialer {
	t.Helper()
	u := s.Client().CoreV1().RESTClient().Post().Resource("pods").Namespace(testNS).Name(testPod).SubResource("portforward").URL()
	d, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, s.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// forward runs a client-go port forwarder to the test pod's gRPC port on a
// free local port until the test ends. It returns the local address and a
// channel that receives ForwardPorts' result when the session ends.
func forward(t *testing.T, d streamhttp.Dialer) (string, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	pf, err := portforward.NewOnAddressesForStreamingWithContext(ctx, d, []string{"127.0.0.1"},
		[]string{"0:" + strconv.Itoa(grpcPort)}, ready, io.Discard, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	result := make(chan error, 1) // ForwardPorts' result, for the caller
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		result <- pf.ForwardPorts()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(ioTimeout):
			t.Errorf("port forwarder did not stop")
		}
	})
	select {
	case <-ready:
	case <-finished:
		t.Fatalf("port-forward failed before ready: %v", <-result)
	case <-time.After(ioTimeout):
		t.Fatal("port-forward not ready after 10s")
	}
	ports, err := pf.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), result
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func echo(t *testing.T, c net.Conn, msg []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo mismatch: got %q, want %q", got, msg)
	}
}

// echoRoundTrip sends a random payload through a new forwarded connection,
// writing and reading concurrently, and checks every byte comes back.
func echoRoundTrip(t *testing.T, addr string) {
	t.Helper()
	c := dial(t, addr)
	payload := make([]byte, payloadSize)
	_, _ = rand.Read(payload)
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		werr <- err
	}()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("echoed payload differs")
	}
	c.Close()
}

func kubectlErr(s *sandbox.Sandbox, kubeconfig string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.KubectlPath(), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = kubectlEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func kubectl(t *testing.T, s *sandbox.Sandbox, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := kubectlErr(s, kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// kubectlEnv keeps a developer's kubectl settings out of the test.
func kubectlEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
}

var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)

// kubectlPortForward runs the real `kubectl port-forward` to target until the
// test ends and returns the local address it listens on.
func kubectlPortForward(t *testing.T, s *sandbox.Sandbox, target string) string {
	t.Helper()
	return kubectlPortForwardIn(t, s, testNS, target, grpcPort)
}

// kubectlPortForwardIn is kubectlPortForward to any namespace and port.
func kubectlPortForwardIn(t *testing.T, s *sandbox.Sandbox, ns, target string, port int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, s.KubectlPath(), "--kubeconfig", s.Kubeconfig(), "-n", ns,
		"port-forward", "--address", "127.0.0.1", target, ":"+strconv.Itoa(port))
	cmd.Env = kubectlEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := forwardingRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- "127.0.0.1:" + m[1]:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel() // kills the kubectl process
		<-scanDone
		_ = cmd.Wait()
	})
	select {
	case a := <-addr:
		return a
	case <-scanDone:
		t.Fatalf("kubectl port-forward %s exited: %s", target, stderr.String())
	case <-time.After(ioTimeout):
		t.Fatalf("kubectl port-forward %s: no 'Forwarding from' line after 10s; stderr: %s", target, stderr.String())
	}
	return ""
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(ioTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// childProcesses lists the pids of this process's children named comm.
func childProcesses(t *testing.T, comm string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// stat: "pid (comm) state ppid ..."; comm may hold spaces, so split
		// at the last ')'.
		s := string(stat)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(s[closing+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		if ppid == self && s[open+1:closing] == comm {
			pids = append(pids, pid)
		}
	}
	return pids
}
