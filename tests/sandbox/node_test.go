package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

const (
	clusterNS    = "cluster-test"
	podtoolImage = "sandbox.local/podtool:test"
	ioTimeout    = 30 * time.Second
)

// podtoolArchive builds the test pods' program and packs it as image
// podtoolImage; it returns the archive and the image's digest.
func podtoolArchive(ctx context.Context, t *testing.T) (archive, digest string) {
	t.Helper()
	dir := t.TempDir()
	podtool, err := sandbox.BuildBinary(ctx, "./tests/sandbox/podtool", dir)
	if err != nil {
		t.Fatal(err)
	}
	archive = filepath.Join(dir, "podtool.tar")
	if digest, err = sandbox.PackBinary(archive, podtoolImage, podtool); err != nil {
		t.Fatal(err)
	}
	return archive, digest
}

// TestNode checks, through real clients only, that the sandbox is a real
// cluster: a kubelet v1.37.2 on containerd runs pods from imported images
// on the pod network; Services resolve by name in pods and reach pods and
// host services; logs, exec and port-forward (WebSocket and SPDY) work;
// Stop leaves the machine as it was.
func TestNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	archive, digest := podtoolArchive(ctx, t)
	var before map[string]string
	began := time.Now()
	s := sandbox.StartForTestWith(t, sandbox.Config{Images: []string{archive},
		Locked: func() { before = machineState(t) }})
	t.Logf("sandbox with a Ready node and DNS started in %s", time.Since(began).Round(time.Millisecond))
	if err := s.EnsureNamespace(ctx, clusterNS); err != nil {
		t.Fatal(err)
	}

	t.Run("node", func(t *testing.T) {
		node, err := s.Client().CoreV1().Nodes().Get(ctx, sandbox.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		info := node.Status.NodeInfo
		if info.KubeletVersion != "v1.37.2" || !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://") {
			t.Fatalf("node runs kubelet %q on %q; want v1.37.2 on containerd://", info.KubeletVersion, info.ContainerRuntimeVersion)
		}
		var ip string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		if ip != sandbox.NodeIP {
			t.Fatalf("node InternalIP %q, want %s", ip, sandbox.NodeIP)
		}
		out := kubectl(t, s, "version")
		for _, want := range []string{"Client Version: v1.37.2", "Server Version: v1.37.2"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl version: missing %q in\n%s", want, out)
			}
		}
	})
	t.Run("deployment-pod-network", func(t *testing.T) { testDeployment(ctx, t, s, digest) })
	t.Run("service-dns", func(t *testing.T) { testServiceDNS(ctx, t, s) })
	t.Run("host-service", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "the host says hi") }))
		t.Cleanup(srv.Close)
		if err := s.ExposeHostService(ctx, clusterNS, "on-host", 80, srv.Listener.Addr().String()); err != nil {
			t.Fatal(err)
		}
		runJob(ctx, t, s, "to-host", []string{"get", "http://on-host." + clusterNS + ".svc/"})
		if out := kubectl(t, s, "-n", clusterNS, "logs", "job/to-host"); !strings.Contains(out, "200 OK the host says hi") {
			t.Fatalf("job/to-host logs: %q", out)
		}
	})
	t.Run("job-fails", func(t *testing.T) { testJobFails(ctx, t, s) })
	t.Run("exec", func(t *testing.T) {
		out := kubectl(t, s, "-n", clusterNS, "exec", "deploy/echo", "--", "/podtool", "inspect", "--env", "POD_NAME")
		if !regexp.MustCompile(`env POD_NAME="echo-[a-z0-9-]+" set=true`).MatchString(out) || !strings.Contains(out, "uid=65532") {
			t.Fatalf("kubectl exec: %q", out)
		}
	})
	t.Run("limited-node-link", func(t *testing.T) { testLimitedNodeLink(ctx, t, s) })
	t.Run("stop-restores-machine", func(t *testing.T) {
		pids := append(s.ContainerPIDs(), s.NodePIDs()...)
		if len(pids) < 6 {
			t.Fatalf("only %d container and node processes before Stop: nothing to check", len(pids))
		}
		pids = append(pids, s.APIServerPID(), s.ControllerManagerPID(), s.SchedulerPID())
		began := time.Now()
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("Stop took %s", time.Since(began).Round(time.Millisecond))
		for _, pid := range pids {
			if sandbox.Alive(pid) {
				t.Errorf("pid %d still runs after Stop", pid)
			}
		}
		machineUnchanged(t, before)
	})
}

func podtoolContainer(name string, args ...string) corev1.Container {
	return corev1.Container{
		Name:            name,
		Image:           podtoolImage,
		ImagePullPolicy: corev1.PullNever,
		Args:            args,
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"},
		}}},
		SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](65532), RunAsNonRoot: ptr.To(true)},
	}
}

// Two replicas listen on the same container port, each with its own pod IP
// on the pod network; a port-forward to each (WebSocket, then SPDY)
// reaches that one. The containers run the imported image: their status
// carries its digest.
func testDeployment(ctx context.Context, t *testing.T, s *sandbox.Sandbox, digest string) {
	c := podtoolContainer("echo", "serve", "--listen=:8080")
	c.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 1}
	labels := map[string]string{"app": "echo"}
	_, err := s.Client().AppsV1().Deployments(clusterNS).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{c}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.WaitForDeploymentAvailable(wctx, clusterNS, "echo"); err != nil {
		t.Fatal(err)
	}
	t.Logf("deployment of 2 available after %s", time.Since(began).Round(time.Millisecond))
	pods, err := s.Client().CoreV1().Pods(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "app=echo"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d pods, want 2", len(pods.Items))
	}
	podNet := netip.MustParsePrefix(sandbox.PodCIDR)
	if a, b := pods.Items[0].Status.PodIP, pods.Items[1].Status.PodIP; a == b {
		t.Fatalf("both pods have IP %q", a)
	}
	for _, pod := range pods.Items {
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil || !podNet.Contains(ip) {
			t.Errorf("pod %s has IP %q, not in the pod network %s", pod.Name, pod.Status.PodIP, podNet)
		}
		st := pod.Status.ContainerStatuses[0]
		if !strings.HasSuffix(st.ImageID, digest) || !strings.HasPrefix(st.ContainerID, "containerd://") {
			t.Errorf("pod %s: container %s runs image %s (%s); want the imported one, %s", pod.Name, st.ContainerID, st.Image, st.ImageID, digest)
		}
		for _, env := range [][]string{nil, {"KUBECTL_PORT_FORWARD_WEBSOCKETS=false"}} {
			local := kubectlPortForward(t, s, env, "pod/"+pod.Name, 8080)
			if body := httpGet(t, "http://"+local+"/"); !strings.Contains(body, "pod="+pod.Name+" host="+pod.Name) {
				t.Fatalf("port-forward (%v) to %s answered %q", env, pod.Name, body)
			}
		}
	}
}

// Pods reach a Service by its DNS names (CoreDNS behind kube-dns,
// kube-proxy's nftables rules), and the API server with client-go's
// in-cluster configuration (token, CA, KUBERNETES_SERVICE_HOST).
func testServiceDNS(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	_, err := s.Client().CoreV1().Services(clusterNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the echo service's endpoints", func() bool {
		slices, err := s.Client().DiscoveryV1().EndpointSlices(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=echo"})
		if err != nil {
			return false
		}
		ready := 0
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				if ptr.Deref(ep.Conditions.Ready, false) {
					ready++
				}
			}
		}
		return ready == 2
	})
	if err := s.WaitForServiceRouted(ctx, clusterNS, "echo"); err != nil {
		t.Fatal(err)
	}
	for name, url := range map[string]string{"short": "http://echo/", "fqdn": "http://echo." + clusterNS + ".svc.cluster.local/"} {
		runJob(ctx, t, s, "dns-"+name, []string{"get", url})
		if out := kubectl(t, s, "-n", clusterNS, "logs", "job/dns-"+name); !strings.Contains(out, "GET "+url+": 200 OK pod=echo-") {
			t.Fatalf("job/dns-%s logs: %q", name, out)
		}
	}
	runJob(ctx, t, s, "whoami", []string{"incluster"})
	out := kubectl(t, s, "-n", clusterNS, "logs", "job/whoami")
	if !strings.Contains(out, "I am system:serviceaccount:"+clusterNS+":default") || !strings.Contains(out, "via https://10.96.0.1:443") {
		t.Fatalf("job/whoami logs: %q", out)
	}
}

func testJobFails(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	createJob(ctx, t, s, "fails", []string{"exit", "--code=3", "--message=on stdout", "--stderr=failing on purpose"})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := s.WaitForJob(wctx, clusterNS, "fails")
	if !errors.Is(err, sandbox.ErrJobFailed) {
		t.Fatalf("WaitForJob: %v, want ErrJobFailed", err)
	}
	pods, err := s.Client().CoreV1().Pods(clusterNS).List(ctx, metav1.ListOptions{LabelSelector: "job-name=fails"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of job fails: %v, %v", pods, err)
	}
	pod := pods.Items[0]
	term := pod.Status.ContainerStatuses[0].State.Terminated
	if pod.Status.Phase != corev1.PodFailed || term == nil || term.ExitCode != 3 || term.Reason != "Error" {
		t.Fatalf("pod %s: phase %s, terminated %+v; want Failed, exit code 3, reason Error", pod.Name, pod.Status.Phase, term)
	}
	out := kubectl(t, s, "-n", clusterNS, "logs", "job/fails")
	if !strings.Contains(out, "on stdout") || !strings.Contains(out, "failing on purpose") {
		t.Fatalf("kubectl logs job/fails: %q", out)
	}
}

// runJob runs podtool with args as a Job (no retries) and waits for it to
// complete.
func runJob(ctx context.Context, t *testing.T, s *sandbox.Sandbox, name string, args []string) *batchv1.Job {
	t.Helper()
	createJob(ctx, t, s, name, args)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	job, err := s.WaitForJob(wctx, clusterNS, name)
	if err != nil {
		logs, _ := kubectlErr(s, nil, "-n", clusterNS, "logs", "job/"+name)
		t.Fatalf("%v\nlogs: %s", err, logs)
	}
	return job
}

func createJob(ctx context.Context, t *testing.T, s *sandbox.Sandbox, name string, args []string) {
	t.Helper()
	_, err := s.Client().BatchV1().Jobs(clusterNS).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{podtoolContainer("main", args...)},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: ioTimeout}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func kubectlErr(s *sandbox.Sandbox, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.KubectlPath(), append([]string{"--kubeconfig", s.Kubeconfig()}, args...)...)
	// A developer's kubectl settings stay out of the test.
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func kubectl(t *testing.T, s *sandbox.Sandbox, args ...string) string {
	t.Helper()
	out, err := kubectlErr(s, nil, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)

// kubectlPortForward runs the real `kubectl port-forward` to target in
// clusterNS until the test ends and returns the local address it listens
// on.
func kubectlPortForward(t *testing.T, s *sandbox.Sandbox, env []string, target string, port int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, s.KubectlPath(), "--kubeconfig", s.Kubeconfig(), "-n", clusterNS,
		"port-forward", "--address", "127.0.0.1", target, ":"+strconv.Itoa(port))
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
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
		t.Fatalf("kubectl port-forward %s: no 'Forwarding from' line; stderr: %s", target, stderr.String())
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
		time.Sleep(100 * time.Millisecond)
	}
}

// volatileSysctls change on their own on a running machine.
var volatileSysctls = regexp.MustCompile(`^(kernel/random/|kernel/ns_last_pid$|kernel/pty/nr$|fs/dentry-state$|fs/inode-nr$|fs/inode-state$|fs/file-nr$|fs/quota/|net/netfilter/nf_conntrack_count$|kernel/sched_domain/|kernel/perf_event_max_sample_rate$|fs/aio-nr$)`)

// machineState is what a sandbox could leave behind on the machine: this
// process's children, the host's mounts, the top of every cgroup
// hierarchy, network links and namespaces, routes, the nftables ruleset
// and every sysctl — as a map of "what" → value.
// machineUnchanged fails t for every part of machineState that differs
// from before, or is new.
func machineUnchanged(t *testing.T, before map[string]string) {
	t.Helper()
	after := machineState(t)
	for _, k := range sortedKeys(before) {
		if before[k] != after[k] {
			t.Errorf("%s changed:\nbefore: %s\nafter:  %s", k, before[k], after[k])
		}
	}
	for _, k := range sortedKeys(after) {
		if _, ok := before[k]; !ok {
			t.Errorf("%s is new after Stop: %s", k, after[k])
		}
	}
}

func machineState(t *testing.T) map[string]string {
	t.Helper()
	st := map[string]string{}
	st["child processes"] = strings.Join(childProcesses(), ", ")
	var mounts []string
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			// mount id, parent id, major:minor, root, mount point, options...
			f := strings.Fields(line)
			if len(f) > 5 {
				mounts = append(mounts, f[4]+" "+f[3]+" "+f[5])
			}
		}
	}
	sort.Strings(mounts)
	st["mounts"] = strings.Join(mounts, "\n")
	hierarchies, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range hierarchies {
		entries, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", h.Name()))
		var dirs []string
		for _, e := range entries {
			if e.IsDir() {
				dirs = append(dirs, e.Name())
			}
		}
		st["cgroups in "+h.Name()] = strings.Join(dirs, " ")
	}
	netns, _ := os.ReadDir("/run/netns")
	var names []string
	for _, e := range netns {
		names = append(names, e.Name())
	}
	st["network namespaces"] = strings.Join(names, " ")
	for what, argv := range map[string][]string{
		"links":          {"ip", "-o", "link", "show"},
		"addresses":      {"ip", "-o", "addr", "show"},
		"routes":         {"ip", "route", "show", "table", "all"},
		"nftables rules": {"nft", "list", "ruleset"},
	} {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
		}
		st[what] = strings.TrimSpace(string(out))
	}
	_ = filepath.WalkDir("/proc/sys", func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		rel := strings.TrimPrefix(p, "/proc/sys/")
		if volatileSysctls.MatchString(rel) {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil {
			st["sysctl "+rel] = strings.TrimSpace(string(b))
		}
		return nil
	})
	return st
}

// childProcesses lists this process's live children as "pid comm".
func childProcesses() []string {
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	var out []string
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		st := string(stat)
		open, closing := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(st[closing+1:])
		if len(fields) >= 2 && fields[1] == self && fields[0] != "Z" {
			out = append(out, e.Name()+" "+st[open+1:closing])
		}
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// LimitNodeEgress holds what leaves the node to its rate: 4 MiB from a
// pod to the host (which reaches pods through the node's veth) take at
// least the time the rate allows for them, less the bucket's burst. A
// busy machine only makes the transfer slower, never faster. Lifting
// the limit removes the qdisc.
func testLimitedNodeLink(ctx context.Context, t *testing.T, s *sandbox.Sandbox) {
	const size = 4 << 20
	const rateBytes = 2_000_000 // "16mbit"
	c := podtoolContainer("bytes", "bytes", "--listen=:8080", "--size="+strconv.Itoa(size))
	pod, err := s.Client().CoreV1().Pods(clusterNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bytes"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{c}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if pod, err = s.WaitForPod(wctx, clusterNS, pod.Name, sandbox.PodReady); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(pod.Status.PodIP, "8080")
	read := func() time.Duration {
		t.Helper()
		var conn net.Conn
		deadline := time.Now().Add(30 * time.Second)
		for conn, err = net.DialTimeout("tcp", addr, 5*time.Second); err != nil; conn, err = net.DialTimeout("tcp", addr, 5*time.Second) {
			if time.Now().After(deadline) {
				t.Fatalf("dial %s: %v", addr, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		defer conn.Close()
		began := time.Now()
		n, err := io.Copy(io.Discard, conn)
		if err != nil || n != size {
			t.Fatalf("read %d of %d bytes from %s: %v", n, size, addr, err)
		}
		return time.Since(began)
	}
	lift, err := s.LimitNodeEgress(ctx, "16mbit")
	if err != nil {
		t.Fatal(err)
	}
	took := read()
	// The bucket may start full (512 KiB); the rest comes at the rate.
	least := time.Duration(float64(size-512<<10) / rateBytes * float64(time.Second))
	if took < least {
		t.Errorf("4 MiB from the node at 16 Mbit/s took %s, less than the %s the rate allows", took, least)
	}
	if err := lift(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", "etcdbackup-node", "tc", "qdisc", "show", "dev", "eth0").CombinedOutput()
	if err != nil || strings.Contains(string(out), "tbf") {
		t.Fatalf("after lifting the limit, the node's link has: %s (%v)", out, err)
	}
	t.Logf("4 MiB at 16 Mbit/s: %s; without the limit: %s", took.Round(time.Millisecond), read().Round(time.Millisecond))
}
