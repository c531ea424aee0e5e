package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// The day a control-plane node is lost, end to end, as a kubeadm
// operator lives it (issue 39):
//
//   - the sandbox keeps its PKI, encryption configuration and static-pod
//     manifests where kubeadm does, and encrypts Secrets at rest; a Secret,
//     a ServiceAccount token and a Deployment exist;
//   - a backup of the control plane goes to S3 with its recovery kit, read
//     by a kit agent pod through a hostPath and sealed there;
//   - the control plane stops and its etcd data, PKI, encryption
//     configuration and manifests are wiped: an empty node;
//   - with KUBECONFIG=/dev/null, only the storage configuration and the
//     kit's identity, `restore --local --rebuild` brings it back, and the
//     control plane starts from the rebuilt manifests.
//
// Then the old admin kubeconfig still authenticates, the pre-disaster
// ServiceAccount token still validates, the Secret reads back in
// plaintext, the node is Ready and the Deployment replaces a pod. The
// time from the empty node to a Ready node is the RTO
// (docs/benchmarks.md).
func TestControlPlaneNodeRebuild(t *testing.T) {
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	key, other := agetest.NewKey(t), agetest.NewKey(t)
	product, err := world.InstallProductWith(ctx, sb, k, t.TempDir(), &testLog{t: t, prefix: "install: "}, world.ProductOptions{
		Images: im, Kit: &world.Kit{NodeName: sandbox.NodeName, Paths: []string{sb.KubernetesDir()}, Recipients: []string{key.Recipient}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	cs := sb.Client()

	const ns = "rebuild"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, StringData: map[string]string{"password": "hunter2-rebuilt"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "app", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, pauseDeployment(sb, ns, "web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sb.WaitForDeploymentAvailable(ctx, ns, "web"); err != nil {
		t.Fatal(err)
	}
	storageConfig := copyStorageConfig(t, c, product)
	admin, err := os.ReadFile(sb.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	adminCopy := filepath.Join(t.TempDir(), "admin.conf")
	if err := os.WriteFile(adminCopy, admin, 0o600); err != nil {
		t.Fatal(err)
	}
	caKey, err := os.ReadFile(filepath.Join(sb.KubernetesDir(), "pki", "ca.key"))
	if err != nil {
		t.Fatal(err)
	}

	mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "control-plane", "--location", "s3", "--name", "node-backup", "--wait"), "backup --wait")
	// The kit agent stores the kit once the backup is stored.
	var kitName string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		kitName = c.run(t, nil, "etcdbackup", "get", "node-backup", "--location", "s3", "-o", "jsonpath={.status.kit.name}").Stdout
		return kitName != "", nil
	})
	if err != nil || kitName != "node-backup.kit" {
		t.Fatalf("no recovery kit stored with the backup: %v %q\n%s", err, kitName, c.run(t, nil, "-n", "etcdbackup-restore", "logs", "-l", "app.kubernetes.io/component=kit-agent"))
	}
	if out := mustSucceed(t, c.run(t, nil, "etcdbackup", "describe", "node-backup", "--location", "s3"), "describe").Stdout; !strings.Contains(out, "Recovery Kit:") ||
		!strings.Contains(out, filepath.Join(sb.KubernetesDir(), "pki", "ca.key")) || !strings.Contains(out, "Kubernetes v1.37.2") || !strings.Contains(out, key.Recipient) {
		t.Errorf("describe does not show the kit:\n%s", out)
	}
	// The stored kit holds no plaintext: the CA key is nowhere in S3.
	stored := findFile(t, product.S3.Dir, "node-backup.kit.db")
	if b, err := os.ReadFile(stored); err != nil || bytes.Contains(b, caKey[30:90]) {
		t.Fatalf("the stored kit %s holds the CA key in plaintext (or cannot be read: %v)", stored, err)
	}
	if out := mustSucceed(t, c.run(t, nil, "etcdbackup", "verify", "node-backup", "--location", "s3", "--identity", key.File), "verify --identity").Stdout; !strings.Contains(out, `recovery kit "node-backup.kit": opened here`) {
		t.Errorf("verify --identity:\n%s", out)
	}

	// The kit's identity opens the Secrets the API server encrypted at
	// rest: extract finds the EncryptionConfiguration in the kit.
	r := mustSucceed(t, c.run(t, nil, "etcdbackup", "extract", "node-backup", "secrets", "db", "--object-namespace", ns, "--location", "s3", "--identity", key.File), "extract secrets --identity")
	if !strings.Contains(r.Stdout, base64.StdEncoding.EncodeToString([]byte("hunter2-rebuilt"))) || !strings.Contains(r.Stderr, "EncryptionConfiguration of the backup's recovery kit") {
		t.Errorf("extract of a Secret encrypted at rest, with the kit's identity: %s", r)
	}

	rebuild := []string{"etcdbackup", "restore", "node-backup", "--local", "--rebuild", "--storage-config", storageConfig,
		"--manifests-dir", sb.ManifestsDir(), "--kubelet", filepath.Join(os.Getenv("ETCDBACKUP_KUBE_BIN_DIR"), "kubelet")}
	noKubeconfig := []string{"KUBECONFIG=" + os.DevNull}
	t.Run("refusals", func(t *testing.T) {
		r := c.run(t, noKubeconfig, append(rebuild, "--identity", other.File, "--dry-run")...)
		if r.ExitCode != 4 || !strings.Contains(r.Stderr, "none of the identities given opens the recovery kit") || !strings.Contains(r.Stderr, key.Recipient) {
			t.Errorf("a wrong identity: %s", r)
		}
		// kubeadm's default manifest directory is not where this node
		// keeps them: the refusal names where the kit has them.
		r = c.run(t, noKubeconfig, "etcdbackup", "restore", "node-backup", "--local", "--rebuild", "--storage-config", storageConfig,
			"--kubelet", rebuild[len(rebuild)-1], "--identity", key.File, "--dry-run")
		if r.ExitCode != 4 || !strings.Contains(r.Stderr, "pass that as --manifests-dir") || !strings.Contains(r.Stderr, sb.ManifestsDir()) {
			t.Errorf("no etcd manifest where kubeadm keeps it: %s", r)
		}
		r = c.run(t, noKubeconfig, append(rebuild[:len(rebuild)-2], "--kubelet", "/nonexistent/kubelet", "--identity", key.File, "--dry-run")...)
		if r.ExitCode != 4 || !strings.Contains(r.Stderr, "install kubelet v1.37.2") {
			t.Errorf("a node without the kit's kubelet: %s", r)
		}
		// A byte of the stored kit flipped: refused by the server's check
		// and by the rebuild, then put back.
		b, err := os.ReadFile(stored)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		if err := os.WriteFile(stored, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if r := c.run(t, nil, "etcdbackup", "verify", "node-backup", "--location", "s3"); r.ExitCode == 0 {
			t.Errorf("verify of a kit with a flipped byte: %s", r)
		}
		if r := c.run(t, noKubeconfig, append(rebuild, "--identity", key.File, "--dry-run")...); r.ExitCode != 5 || !strings.Contains(r.Stderr, "fails its SHA-256") {
			t.Errorf("a rebuild from a kit with a flipped byte: %s", r)
		}
		b[len(b)/2] ^= 1
		if err := os.WriteFile(stored, b, 0o600); err != nil {
			t.Fatal(err)
		}
	})

	// The disaster: an empty control-plane node.
	if err := sb.StopControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{sb.KubernetesDir(), sb.EtcdMember().DataDir} {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	empty := time.Now()
	r = mustSucceed(t, c.run(t, noKubeconfig, append(rebuild, "--identity", key.File)...), "restore --rebuild with the API server down")
	t.Logf("rebuild took %s:\n%s%s", time.Since(empty).Round(time.Millisecond), r.Stdout, r.Stderr)
	if err := sb.StartControlPlaneFromManifests(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.WaitForNodeReady(ctx, empty); err != nil {
		t.Fatal(err)
	}
	rto := time.Since(empty)
	t.Logf("RTO: an empty control-plane node to a Ready node in %s", rto.Round(100*time.Millisecond))

	// The old admin kubeconfig authenticates.
	mustSucceed(t, (&world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: adminCopy}).Run(ctx, "get", "nodes"), "kubectl get nodes with the admin kubeconfig of before")
	// The pre-disaster ServiceAccount token validates.
	review, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: tok.Status.Token}}, metav1.CreateOptions{})
	if err != nil || !review.Status.Authenticated || review.Status.User.Username != "system:serviceaccount:"+ns+":app" {
		t.Errorf("the ServiceAccount token of before: %+v %v", review.Status, err)
	}
	// The Secret, encrypted at rest, reads back in plaintext.
	got := mustSucceed(t, c.run(t, nil, "-n", ns, "get", "secret", "db", "-o", "jsonpath={.data.password}"), "kubectl get secret").Stdout
	if p, _ := base64.StdEncoding.DecodeString(got); string(p) != "hunter2-rebuilt" {
		t.Errorf("the Secret after the rebuild: %q", p)
	}
	// Workloads run: the Deployment replaces a deleted pod.
	deletedPodIsReplaced(ctx, t, sb, ns, "web")

	// The product's own keys, which the backup held, rotated on request;
	// the server takes backups with the new ones. The restore removed
	// them, and the server made new ones: rotate those.
	uids := func() string {
		return c.run(t, nil, "-n", world.DefaultNamespace, "get", "secret", "etcdbackup-job-signing-key", "etcdbackup-agent-ca",
			"-o", "jsonpath={.items[*].metadata.uid}").Stdout
	}
	var before string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		before = uids()
		return len(strings.Fields(before)) == 2, nil
	}); err != nil {
		t.Fatalf("the server made no new keys after the restore removed them: %q", before)
	}
	// An agent Job that runs is named, and nothing changes. (The restored
	// etcd may hold the backup's own Job as running, as it was at the
	// snapshot, until its pod is seen gone: --force below.)
	standIn := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "drill-stand-in", Labels: map[string]string{"app.kubernetes.io/managed-by": "etcdbackup-server", "app.kubernetes.io/component": "drill-agent"}},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "pause", Image: sb.PauseImage()}},
		}}},
	}
	if _, err := cs.BatchV1().Jobs(world.DefaultNamespace).Create(ctx, standIn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r = c.run(t, nil, "etcdbackup", "rotate-keys")
	if r.ExitCode != 4 || !strings.Contains(r.Stderr, "drill-stand-in") || !strings.Contains(r.Stderr, "--force") || uids() != before {
		t.Errorf("rotate-keys with an agent Job running: %s", r)
	}
	if err := cs.BatchV1().Jobs(world.DefaultNamespace).Delete(ctx, standIn.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r = mustSucceed(t, c.run(t, nil, "etcdbackup", "rotate-keys", "--force"), "rotate-keys --force")
	if after := uids(); after == before || len(strings.Fields(after)) != 2 || !strings.Contains(r.Stdout, "rotated the data server's Job-signing key and agent CA") {
		t.Errorf("rotate-keys: %s; the key Secrets' uids %q, then %q", r, before, after)
	}
	mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "control-plane", "--location", "s3", "--name", "after-rotation", "--wait"), "a backup with the rotated keys")
}

// findFile is the one file called name under dir.
func findFile(t *testing.T, dir, name string) string {
	t.Helper()
	var found []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == name && !d.IsDir() {
			found = append(found, p)
		}
		return nil
	})
	if len(found) != 1 {
		t.Fatalf("files called %s under %s: %v", name, dir, found)
	}
	return found[0]
}
