package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	ebplugin "github.com/kubectl-etcdbackup/kubectl-etcdbackup/plugin"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// cluster is the sandbox with the server installed in the default
// namespace, shared by the tunnel tests (starting it takes seconds).
type cluster struct {
	sb      *sandbox.Sandbox
	images  *world.Images
	kubectl *world.Kubectl
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	sb, im := startSandbox(t)
	c := &cluster{sb: sb, images: im, kubectl: &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := world.InstallServer(ctx, sb, c.kubectl, world.DefaultNamespace, im, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return c
}

// serverAddr is a local address forwarded by a real `kubectl
// port-forward` to the installed server pod's user API (its loopback,
// the only way in), for an agent run on the host: it calls as a user
// would, not as an agent pod.
func (c *cluster) serverAddr(t *testing.T) string {
	t.Helper()
	pod := installedServerPod(context.Background(), t, c.sb, world.DefaultNamespace)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := c.kubectl.Command(ctx, "-n", world.DefaultNamespace, "port-forward", "pod/"+pod.Name, ":"+strconv.Itoa(world.ServerPort))
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	drained := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-drained
		_ = cmd.Wait()
	})
	// "Forwarding from 127.0.0.1:PORT -> 50051"
	line, err := r.ReadString('\n')
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, r)
	}()
	if err != nil {
		t.Fatalf("kubectl port-forward: %v", err)
	}
	fields := strings.Fields(line)
	if len(fields) < 3 || fields[0] != "Forwarding" {
		t.Fatalf("kubectl port-forward said %q", line)
	}
	if _, _, err := net.SplitHostPort(fields[2]); err != nil {
		t.Fatalf("kubectl port-forward said %q", line)
	}
	return fields[2]
}

func (c *cluster) run(t *testing.T, env []string, args ...string) world.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := *c.kubectl
	k.Env = env
	cmd := k.Command(ctx, args...)
	cmd.Dir = t.TempDir()
	return world.RunCommand(cmd)
}

func TestTunnel(t *testing.T) {
	c := startCluster(t)

	// kubectl itself finds the plugin on PATH.
	r := mustSucceed(t, c.run(t, nil, "plugin", "list"), "kubectl plugin list")
	if !strings.Contains(r.Stdout, world.PluginBinary) {
		t.Fatalf("kubectl plugin list does not show the plugin: %s", r)
	}

	for _, transport := range []struct {
		name string
		env  []string
	}{
		{"websocket", nil},
		{"spdy", []string{"KUBECTL_PORT_FORWARD_WEBSOCKETS=false"}},
	} {
		t.Run(transport.name, func(t *testing.T) {
			testVerbsThroughAPIServer(t, c, transport.env, "snap-"+transport.name)
		})
	}

	t.Run("rbac", func(t *testing.T) { testRBAC(t, c) })
	t.Run("tunnel-loss", func(t *testing.T) { testTunnelLoss(t, c) })
	t.Run("not-installed", func(t *testing.T) {
		r := mustFail(t, c.run(t, nil, "etcdbackup", "-n", "nothing-here", "list"), "list in an empty namespace")
		if !strings.Contains(r.Stderr, `no etcdbackup server is installed in namespace "nothing-here"`) || !strings.Contains(r.Stderr, "-n NAMESPACE") {
			t.Fatalf("error does not explain: %s", r)
		}
	})
	t.Run("not-ready", func(t *testing.T) { testNotReady(t, c) })
	t.Run("two-namespaces", func(t *testing.T) { testTwoNamespaces(t, c) })
	t.Run("manifests", func(t *testing.T) {
		// The install manifests are accepted by a real API server,
		// including the restricted Pod Security admission.
		root, err := world.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		r := mustSucceed(t, c.run(t, nil, "apply", "-k", filepath.Join(root, "manifests"), "--dry-run=server"), "kubectl apply -k manifests --dry-run=server")
		for _, want := range []string{"deployment.apps/etcdbackup-server", "service/etcdbackup", "persistentvolumeclaim/etcdbackup-data"} {
			if !strings.Contains(r.Stdout, want) {
				t.Errorf("apply output lacks %s: %s", want, r)
			}
		}
		if strings.Contains(r.Stderr, "would violate PodSecurity") {
			t.Errorf("pod security warnings: %s", r.Stderr)
		}
	})
	t.Run("api-server-unreachable", func(t *testing.T) {
		r := mustFail(t, c.run(t, nil, "etcdbackup", "--server", "https://127.0.0.1:1", "list"), "list against no API server")
		if !strings.Contains(r.Stderr, "cannot reach the Kubernetes API server at https://127.0.0.1:1") {
			t.Fatalf("error does not explain: %s", r)
		}
	})
}

func testVerbsThroughAPIServer(t *testing.T, c *cluster, env []string, name string) {
	dir := t.TempDir()
	src := filepath.Join(dir, "snapshot.db")
	data := writeSnapshotFile(t, src, 5<<20+3)

	r := mustSucceed(t, c.run(t, env, "etcdbackup", "version"), "version")
	if !strings.Contains(r.Stdout, "Server Version:") {
		t.Fatalf("version: %s", r)
	}
	mustSucceed(t, c.run(t, env, "etcdbackup", "upload", src, "--name", name), "upload")
	r = mustSucceed(t, c.run(t, env, "etcdbackup", "list"), "list")
	if !strings.Contains(r.Stdout, name) {
		t.Fatalf("list lacks %s: %s", name, r)
	}
	r = mustSucceed(t, c.run(t, env, "etcdbackup", "get", name, "-o", "json"), "get")
	if !strings.Contains(r.Stdout, sha(data)) {
		t.Fatalf("get lacks the sha: %s", r)
	}
	out := filepath.Join(dir, "out.db")
	mustSucceed(t, c.run(t, env, "etcdbackup", "download", name, "-o", out, "--raw"), "download")
	mustEqualFile(t, out, data)
	mustSucceed(t, c.run(t, env, "etcdbackup", "delete", name), "delete")
	r = mustSucceed(t, c.run(t, env, "etcdbackup", "list", "-o", "json"), "list after delete")
	if strings.Contains(r.Stdout, name) {
		t.Fatalf("deleted backup still listed: %s", r)
	}
}

// A user who may find the server but not port-forward gets told exactly
// which permission is missing; granting it makes the same command work.
func testRBAC(t *testing.T, c *cluster) {
	ctx := context.Background()
	ns := world.DefaultNamespace
	cs := c.sb.Client()
	finder := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "etcdbackup-finder", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "get"}},
		},
	}
	forwarder := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "etcdbackup-user", Namespace: ns},
		Rules:      append(finder.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"create"}}),
	}
	for _, role := range []*rbacv1.Role{finder, forwarder} {
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind := func(user, role string) {
		_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user, APIGroup: rbacv1.GroupName}},
			RoleRef:    rbacv1.RoleRef{Kind: "Role", Name: role, APIGroup: rbacv1.GroupName},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	bind("no-forward", finder.Name)
	bind("operator", forwarder.Name)

	for _, user := range []string{"no-forward", "operator"} {
		kc, err := c.sb.NewUserKubeconfig(user)
		if err != nil {
			t.Fatal(err)
		}
		r := c.run(t, []string{"KUBECONFIG=" + kc}, "etcdbackup", "version")
		if user == "operator" {
			mustSucceed(t, r, "version as a user allowed to port-forward")
			continue
		}
		mustFail(t, r, "version as a user who may not port-forward")
		for _, want := range []string{`"create"`, `"pods/portforward"`, `namespace "` + ns + `"`} {
			if !strings.Contains(r.Stderr, want) {
				t.Errorf("RBAC error does not name %s: %s", want, r)
			}
		}
	}
}

// pacedWriter consumes a download and, at given offsets, breaks every
// connection to the server's port inside its pod (where the node's
// containerd connects each port-forward stream): the tunnel breaks
// mid-stream, deterministically.
type pacedWriter struct {
	sb      *sandbox.Sandbox
	pod     string
	dropAt  []int64
	written int64
	drops   []int
	errs    []error
	sum     io.Writer
}

func (w *pacedWriter) Write(p []byte) (int, error) {
	w.written += int64(len(p))
	if len(w.dropAt) > 0 && w.written >= w.dropAt[0] {
		w.dropAt = w.dropAt[1:]
		n, err := w.sb.DropConnections(context.Background(), world.DefaultNamespace, w.pod, world.ServerPort)
		w.drops = append(w.drops, n)
		if err != nil {
			w.errs = append(w.errs, err)
		}
	}
	return w.sum.Write(p)
}

func testTunnelLoss(t *testing.T, c *cluster) {
	srcPath := filepath.Join(t.TempDir(), "big")
	data := writeSnapshotFile(t, srcPath, 256<<20)
	mustSucceed(t, c.run(t, nil, "etcdbackup", "upload", srcPath, "--name", "big"), "upload")
	want, size := sha(data), int64(len(data))
	data = nil
	pod := installedServerPod(context.Background(), t, c.sb, world.DefaultNamespace)

	for _, transport := range []string{"websocket", "spdy"} {
		t.Run(transport, func(t *testing.T) {
			if transport == "spdy" {
				t.Setenv("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")
			} else {
				t.Setenv("KUBECTL_PORT_FORWARD_WEBSOCKETS", "true")
			}
			h := sha256.New()
			w := &pacedWriter{sb: c.sb, pod: pod.Name, dropAt: []int64{48 << 20, 160 << 20}, sum: h}
			var stderr bytes.Buffer
			// The plugin's own command tree, in process, so the writer can
			// break the tunnel at exact offsets.
			cmd := ebplugin.NewCmdRoot(genericiooptions.IOStreams{In: strings.NewReader(""), Out: w, ErrOut: &stderr})
			cmd.SetArgs([]string{"--kubeconfig", c.sb.Kubeconfig(), "download", "big", "-o", "-", "--raw"})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := cmd.ExecuteContext(ctx); err != nil {
				t.Fatalf("download across tunnel loss: %v\n%s", err, stderr.String())
			}
			if len(w.errs) > 0 {
				t.Fatalf("breaking the tunnel: %v", w.errs)
			}
			if len(w.drops) != 2 || w.drops[0] == 0 || w.drops[1] == 0 {
				t.Fatalf("dropped %v connections at the two points; want some each time: the tunnel was not broken", w.drops)
			}
			if w.written != size {
				t.Fatalf("wrote %d bytes, want %d", w.written, size)
			}
			if got := hex.EncodeToString(h.Sum(nil)); got != want {
				t.Fatalf("sha256 after resuming %s, want %s", got, want)
			}
		})
	}
}

// A server pod that runs but is not Ready, then one that is Pending: the
// plugin says which and what to look at.
func testNotReady(t *testing.T, c *cluster) {
	ctx := context.Background()
	ns := "unready"
	labels := map[string]string{"app.kubernetes.io/name": "etcdbackup-server", "app.kubernetes.io/instance": ns}
	if err := c.sb.CreateService(ctx, ns, "etcdbackup", labels, []corev1.ServicePort{{
		Name: "grpc", Port: world.ServerPort, TargetPort: intstr.FromString("grpc"),
	}}); err != nil {
		t.Fatal(err)
	}
	// The server image, serving, behind a readiness probe that never
	// passes; then a pod no node may run.
	pod := func(name string, nodeSelector map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.PodSpec{
				NodeSelector:                  nodeSelector,
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{
					Name:            "server",
					Image:           c.images.Server,
					ImagePullPolicy: corev1.PullNever,
					Args:            []string{"--listen=127.0.0.1:50051", "--storage-dir=/tmp/backups"},
					Ports:           []corev1.ContainerPort{{Name: "grpc", ContainerPort: world.ServerPort}},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(1)}},
						PeriodSeconds: 1,
					},
					VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
				}},
				Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
		}
	}
	pods := c.sb.Client().CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, pod("etcdbackup-server-5c9d8-abcde", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := c.sb.WaitForPod(wctx, ns, "etcdbackup-server-5c9d8-abcde", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	}); err != nil {
		t.Fatal(err)
	}
	r := mustFail(t, c.run(t, nil, "etcdbackup", "-n", ns, "list"), "list with an unready server")
	if !strings.Contains(r.Stderr, "is not ready") || !strings.Contains(r.Stderr, "Running but not Ready") || !strings.Contains(r.Stderr, "describe pod") {
		t.Fatalf("not-ready error does not explain: %s", r)
	}
	if err := pods.Delete(ctx, "etcdbackup-server-5c9d8-abcde", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, pod("etcdbackup-server-5c9d8-fghij", map[string]string{"etcdbackup.test/no-such-node": "true"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pollUntil(ctx, t, "the running pod to be gone", func() bool {
		_, err := pods.Get(ctx, "etcdbackup-server-5c9d8-abcde", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	r = mustFail(t, c.run(t, nil, "etcdbackup", "-n", ns, "list"), "list with a pending server")
	if !strings.Contains(r.Stderr, "Pending") {
		t.Fatalf("pending error does not name the phase: %s", r)
	}
}

// Two installs in two namespaces: -n picks one, each has its own backups.
func testTwoNamespaces(t *testing.T, c *cluster) {
	ctx := context.Background()
	if err := world.InstallServer(ctx, c.sb, c.kubectl, "team-b", c.images, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var wg sync.WaitGroup
	for _, ns := range []string{world.DefaultNamespace, "team-b"} {
		src := filepath.Join(dir, ns)
		writeSnapshotFile(t, src, 1000)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := c.run(t, nil, "etcdbackup", "-n", ns, "upload", src, "--name", "only-in-"+ns)
			if r.ExitCode != 0 {
				t.Errorf("upload to %s: %s", ns, r)
			}
		}()
	}
	wg.Wait()
	for _, ns := range []string{world.DefaultNamespace, "team-b"} {
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", ns, "list", "-o", "json"), "list in "+ns)
		for _, other := range []string{world.DefaultNamespace, "team-b"} {
			has := strings.Contains(r.Stdout, "only-in-"+other)
			if has != (other == ns) {
				t.Errorf("list -n %s: contains only-in-%s = %v\n%s", ns, other, has, r.Stdout)
			}
		}
	}
	storage, err := c.sb.VolumePath(ctx, "team-b", "etcdbackup-data")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(storage, "backups", "only-in-team-b.json")); err != nil {
		t.Fatalf("team-b's backup is not in team-b's storage: %v", err)
	}
}
