package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// TestCluster installs the product from manifests/ with `kubectl apply -k`,
// exactly as a user would, on the sandbox's real node, whose containerd
// runs the product's images built from this repository — imported and
// named as the manifests name them by default, as on an air-gapped node.
func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	began := time.Now()
	sb, im := startSandbox(t)
	if err := im.TagAsManifestDefaults(ctx, sb); err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox up, images imported in %s", time.Since(began).Round(time.Millisecond))
	c := &cluster{sb: sb, kubectl: &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}}
	root, err := world.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ns := world.DefaultNamespace

	installed := time.Now()
	mustSucceed(t, c.run(t, nil, "apply", "-k", filepath.Join(root, "manifests")), "kubectl apply -k manifests")
	waitServerAvailable(ctx, t, sb, ns)
	t.Logf("kubectl apply -k manifests → server Deployment Available in %s (%s since the sandbox started)",
		time.Since(installed).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))

	t.Run("runs-built-images", func(t *testing.T) { testRunsBuiltImages(ctx, t, c, im, ns) })

	t.Run("version-through-tunnel", func(t *testing.T) {
		for _, env := range [][]string{nil, {"KUBECTL_PORT_FORWARD_WEBSOCKETS=false"}} {
			r := mustSucceed(t, c.run(t, env, "etcdbackup", "version"), "kubectl etcdbackup version")
			if !strings.Contains(r.Stdout, "Server Version:") || !strings.Contains(r.Stdout, "/var/lib/etcdbackup") {
				t.Fatalf("version: %s", r)
			}
		}
	})

	t.Run("agent-job-fails", func(t *testing.T) {
		createAgentJob(ctx, t, sb, ns, "backup-without-server", "backup", "--name=nowhere")
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if _, err := sb.WaitForJob(wctx, ns, "backup-without-server"); !errors.Is(err, sandbox.ErrJobFailed) {
			t.Fatalf("WaitForJob: %v, want ErrJobFailed", err)
		}
		pods, err := sb.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=backup-without-server"})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("pods of the job: %v %v", pods, err)
		}
		pod := pods.Items[0]
		term := pod.Status.ContainerStatuses[0].State.Terminated
		if pod.Status.Phase != corev1.PodFailed || term == nil || term.ExitCode != 1 {
			t.Fatalf("pod %s: phase %s, terminated %+v; want Failed with exit code 1", pod.Name, pod.Status.Phase, term)
		}
		r := mustSucceed(t, c.run(t, nil, "-n", ns, "logs", "job/backup-without-server"), "kubectl logs")
		if !strings.Contains(r.Stdout, `required flag(s) "server" not set`) {
			t.Fatalf("kubectl logs of the failed job: %s", r)
		}
	})

	t.Run("server-pod-replaced", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "snap.db")
		data := writeSnapshotFile(t, src, 1<<20+7)
		mustSucceed(t, c.run(t, nil, "etcdbackup", "upload", src, "--name", "before-replace"), "upload")
		old := installedServerPod(ctx, t, sb, ns)
		mustSucceed(t, c.run(t, nil, "-n", ns, "delete", "pod", old.Name), "kubectl delete pod")
		replaced := time.Now()
		pollUntil(ctx, t, "a new server pod", func() bool {
			p, err := findServerPod(ctx, sb, ns)
			return err == nil && p.UID != old.UID && sandbox.PodReady(p)
		})
		waitServerAvailable(ctx, t, sb, ns)
		t.Logf("replacement pod Ready %s after the delete", time.Since(replaced).Round(time.Millisecond))

		dir, err := sb.VolumePath(ctx, ns, "etcdbackup-data")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "backups", "before-replace.json")); err != nil {
			t.Fatalf("the PVC's directory lost the backup: %v", err)
		}
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "list"), "list through the new pod")
		if !strings.Contains(r.Stdout, "before-replace") {
			t.Fatalf("list after replacement: %s", r)
		}
		out := filepath.Join(t.TempDir(), "out.db")
		mustSucceed(t, c.run(t, nil, "etcdbackup", "download", "before-replace", "-o", out, "--raw"), "download through the new pod")
		mustEqualFile(t, out, data)
	})

	t.Run("two-installs-same-port", func(t *testing.T) {
		// A second install in its own namespace: a kustomize overlay of the
		// same manifests. Both servers listen on the same ports, each in
		// its Pod.
		overlay := namespaceOverlay(t, root, "team-b")
		mustSucceed(t, c.run(t, nil, "apply", "-k", overlay), "kubectl apply -k overlay")
		waitServerAvailable(ctx, t, sb, "team-b")
		a, b := installedServerPod(ctx, t, sb, ns), installedServerPod(ctx, t, sb, "team-b")
		if a.Status.PodIP == b.Status.PodIP {
			t.Fatalf("both servers have IP %s", a.Status.PodIP)
		}
		src := filepath.Join(t.TempDir(), "b.db")
		writeSnapshotFile(t, src, 4096)
		mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", "team-b", "upload", src, "--name", "only-in-team-b"), "upload to team-b")
		rb := mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", "team-b", "list"), "list team-b")
		ra := mustSucceed(t, c.run(t, nil, "etcdbackup", "list"), "list default install")
		if !strings.Contains(rb.Stdout, "only-in-team-b") || strings.Contains(ra.Stdout, "only-in-team-b") || !strings.Contains(ra.Stdout, "before-replace") {
			t.Fatalf("installs are not separate:\nteam-b: %s\n%s: %s", rb.Stdout, ns, ra.Stdout)
		}
	})

	t.Run("replicas", func(t *testing.T) { testReplicas(ctx, t, c, root) })

	t.Run("stop-leaves-no-process", func(t *testing.T) {
		pids := sb.ContainerPIDs()
		if len(pids) < 4 {
			t.Fatalf("container pids %v: want both servers (and their pause processes) running", pids)
		}
		pids = append(pids, sb.NodePIDs()...)
		if err := sb.Stop(); err != nil {
			t.Fatal(err)
		}
		for _, pid := range append(pids, sb.APIServerPID(), sb.ControllerManagerPID(), sb.SchedulerPID()) {
			if sandbox.Alive(pid) {
				t.Errorf("pid %d still runs after Stop", pid)
			}
		}
	})
}

// namespaceOverlay writes a kustomize overlay that installs manifests/
// in namespace ns, with components (paths under the repository root),
// and returns its directory. The one cluster-scoped object bound to a
// namespace, the auth-delegator binding, gets a name of its own and
// this namespace's server as its subject (docs/security.md).
func namespaceOverlay(t *testing.T, root, ns string, components ...string) string {
	t.Helper()
	overlay := t.TempDir()
	rel := func(dir string) string {
		r, err := filepath.Rel(overlay, filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	comps := ""
	if len(components) > 0 {
		comps = "components:\n"
		for _, c := range components {
			comps += "  - " + rel(c) + "\n"
		}
	}
	kust := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %[1]s
resources:
  - %[2]s
%[3]spatches:
  - target: {kind: ClusterRoleBinding, name: etcdbackup-server-auth-delegator}
    patch: |-
      - op: replace
        path: /metadata/name
        value: etcdbackup-server-auth-delegator-%[1]s
      - op: replace
        path: /subjects/0/namespace
        value: %[1]s
`, ns, rel("manifests"), comps)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	return overlay
}

func waitServerAvailable(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := sb.WaitForDeploymentAvailable(wctx, ns, "etcdbackup-server"); err != nil {
		t.Fatal(err)
	}
	// Agent Jobs reach the server by its Service.
	if err := sb.WaitForServiceRouted(wctx, ns, "etcdbackup"); err != nil {
		t.Fatal(err)
	}
}

func findServerPod(ctx context.Context, sb *sandbox.Sandbox, ns string) (*corev1.Pod, error) {
	pods, err := sb.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=etcdbackup-server"})
	if err != nil {
		return nil, err
	}
	var live []*corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			live = append(live, &pods.Items[i])
		}
	}
	if len(live) != 1 {
		return nil, fmt.Errorf("%d server pods in %s", len(live), ns)
	}
	return live[0], nil
}

func installedServerPod(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns string) *corev1.Pod {
	t.Helper()
	p, err := findServerPod(ctx, sb, ns)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// createAgentJob creates a Job of the agent image with args, shaped to
// pass the namespace's restricted Pod Security level, without retries.
func createAgentJob(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns, name string, args ...string) {
	t.Helper()
	_, err := sb.Client().BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy:      corev1.RestartPolicyNever,
				ServiceAccountName: "etcdbackup-agent",
				SecurityContext: &corev1.PodSecurityContext{
					RunAsNonRoot:   ptr.To(true),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				Containers: []corev1.Container{{
					Name:  "agent",
					Image: "etcdbackup-agent:dev",
					Args:  args,
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false),
						ReadOnlyRootFilesystem:   ptr.To(true),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
				}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func pollUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(ctx, t, time.Minute, what, cond)
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// The server, the agent and the CLI run from the images built from this
// repository: their containers' statuses carry the images' digests.
func testRunsBuiltImages(ctx context.Context, t *testing.T, c *cluster, im *world.Images, ns string) {
	server := installedServerPod(ctx, t, c.sb, ns)
	checkImage(t, server, im.Digests[im.Server])

	// The CLI image, as a CI job would run it. From inside the cluster it
	// reaches no server without a token (TestSecurity), so it prints its
	// own version.
	_, err := c.sb.Client().BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "cli-version"},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				SecurityContext: &corev1.PodSecurityContext{
					RunAsNonRoot:   ptr.To(true),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				Containers: []corev1.Container{{
					Name:            "cli",
					Image:           im.CLI,
					ImagePullPolicy: corev1.PullNever,
					Args:            []string{"version", "--client"},
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false),
						ReadOnlyRootFilesystem:   ptr.To(true),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
				}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err = c.sb.WaitForJob(wctx, ns, "cli-version")
	logs := c.run(t, nil, "-n", ns, "logs", "job/cli-version")
	if err != nil || !strings.Contains(logs.Stdout, "Client Version:") {
		t.Fatalf("the CLI image's job: %v\nlogs: %s", err, logs)
	}
	pods, err := c.sb.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=cli-version"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of job cli-version: %v %v", pods, err)
	}
	checkImage(t, &pods.Items[0], im.Digests[im.CLI])
}

// checkImage fails unless every container of pod ran the image with digest.
func checkImage(t *testing.T, pod *corev1.Pod, digest string) {
	t.Helper()
	if digest == "" || len(pod.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s: no digest (%q) or no container status", pod.Name, digest)
	}
	for _, st := range pod.Status.ContainerStatuses {
		if !strings.HasSuffix(st.ImageID, "@"+digest) || !strings.HasPrefix(st.ContainerID, "containerd://") {
			t.Errorf("pod %s: container %s (%s) ran image %s (%s), want digest %s", pod.Name, st.Name, st.ContainerID, st.Image, st.ImageID, digest)
		}
	}
}
