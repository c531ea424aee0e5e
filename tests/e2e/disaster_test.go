package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// The day the control plane's etcd is lost, end to end, as a kubeadm
// operator lives it:
//
//   - an agent Job backs the control plane up into the S3 location; a
//     ConfigMap and a Deployment exist before it, another ConfigMap is made
//     after it;
//   - the operator has copied the server's storage configuration and the
//     S3 credentials out of the cluster beforehand;
//   - etcd and kube-apiserver stop and etcd's data directory is wiped;
//   - with the API server down (KUBECONFIG=/dev/null), `kubectl etcdbackup
//     restore --local --storage-config` rebuilds the member's data from S3;
//   - etcd and the API server start on the restored directory.
//
// Then the pre-backup objects are back and the later one is gone; a new
// object's resourceVersion is above every one seen before the disaster,
// and a watch from one of those is told to relist (410 Gone) instead of
// waiting for revisions that will never come; the node stays Ready; the
// data server serves again and lists the backup; the Deployment replaces
// a pod deleted after the restore.
//
// The same disaster restored with --bump-revision 0 shows what goes wrong
// without the bump: resourceVersions go backwards.
func TestControlPlaneDisasterRecovery(t *testing.T) {
	began := time.Now()
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	product, err := world.InstallProduct(ctx, sb, k, im, t.TempDir(), &testLog{t: t, prefix: "install: "})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	cs := sb.Client()

	const ns = "dr"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mustCreateConfigMap(ctx, t, sb, ns, "before")
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, pauseDeployment(sb, ns, "web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sb.WaitForDeploymentAvailable(ctx, ns, "web"); err != nil {
		t.Fatal(err)
	}

	// What the operator keeps outside the cluster, from the day of the
	// install: the storage configuration and the S3 credentials.
	storageConfig := copyStorageConfig(t, c, product)

	mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "control-plane", "--location", "s3", "--name", "dr-backup", "--wait"), "backup --wait")
	mustCreateConfigMap(ctx, t, sb, ns, "after")
	seen := currentResourceVersion(ctx, t, sb)

	t.Run("restore-from-s3-with-the-api-server-down", func(t *testing.T) {
		restoreControlPlane(ctx, t, c, storageConfig, "dr-backup")

		if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "before", metav1.GetOptions{}); err != nil {
			t.Errorf("ConfigMap made before the backup: %v", err)
		}
		if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "after", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("ConfigMap made after the backup: %v, want it gone", err)
		}
		// resourceVersions only grow: a new object's is above all seen.
		rv := resourceVersion(t, mustCreateConfigMap(ctx, t, sb, ns, "new").ResourceVersion)
		if rv <= seen {
			t.Errorf("a new object's resourceVersion %d is not above %d, seen before the disaster", rv, seen)
		}
		t.Logf("resourceVersion %d before the disaster, %d after the restore", seen, rv)
		// A client that resumes a watch from what it saw before (every
		// informer does) is told its version is gone, and relists.
		w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatInt(seen, 10)})
		if err != nil {
			if !apierrors.IsGone(err) && !apierrors.IsResourceExpired(err) {
				t.Errorf("watch from %d: %v, want 410 Gone", seen, err)
			}
		} else {
			select {
			case ev := <-w.ResultChan():
				if st, ok := ev.Object.(*metav1.Status); ev.Type != watch.Error || !ok || st.Code != 410 {
					t.Errorf("watch from %d: first event %s %+v, want a 410 error", seen, ev.Type, ev.Object)
				}
			case <-ctx.Done():
				t.Error("watch from an old resourceVersion: no event")
			}
			w.Stop()
		}

		// The data server serves again, through the new API server, once
		// the node's routes to it have caught up with the new control plane.
		var r world.Result
		serving := time.Now()
		err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
			r = c.run(t, nil, "etcdbackup", "list", "--location", "s3", "-o", "name")
			return r.ExitCode == 0, nil
		})
		if err != nil || !strings.Contains(r.Stdout, "backup/dr-backup") {
			t.Fatalf("list after the restore: %v: %s", err, r)
		}
		t.Logf("the data server lists the backups %s after the control plane came back", time.Since(serving).Round(time.Millisecond))
		// The controllers' informers recovered: a pod deleted now is
		// replaced.
		deletedPodIsReplaced(ctx, t, sb, ns, "web")
	})

	t.Run("without-the-bump-resource-versions-go-backwards", func(t *testing.T) {
		seen := currentResourceVersion(ctx, t, sb)
		restoreControlPlane(ctx, t, c, storageConfig, "dr-backup", "--bump-revision", "0")
		rv := resourceVersion(t, mustCreateConfigMap(ctx, t, sb, ns, "new-unbumped").ResourceVersion)
		if rv >= seen {
			t.Fatalf("restored without the bump, a new object's resourceVersion %d is not below %d, seen before", rv, seen)
		}
		t.Logf("without --bump-revision: resourceVersion %d before the disaster, %d after the restore: every client holding a newer one keeps a stale cache", seen, rv)
	})
	t.Logf("control-plane disaster recovery: %s in all", time.Since(began).Round(time.Second))
}

// restoreControlPlane is the disaster and the recovery: the control plane
// stops, etcd's data directory is wiped, the plugin restores the member
// from the backup in S3 through kubectl with no kubeconfig at all, and the
// control plane starts on the restored directory. It waits for the node
// to talk to the new control plane.
func restoreControlPlane(ctx context.Context, t *testing.T, c *cluster, storageConfig, backup string, extra ...string) {
	t.Helper()
	sb := c.sb
	m := sb.EtcdMember()
	if err := sb.StopControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(m.DataDir); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(sb.Dir(), fmt.Sprintf("etcd-restored-%d", time.Now().UnixNano()))
	began := time.Now()
	args := append([]string{"etcdbackup", "restore", backup, "--local", "--storage-config", storageConfig,
		"--data-dir", restored, "--member-name", m.Name, "--initial-cluster", m.InitialCluster,
		"--initial-advertise-peer-urls", strings.Join(m.PeerURLs, ","), "--initial-cluster-token", m.InitialClusterToken}, extra...)
	r := mustSucceed(t, c.run(t, []string{"KUBECONFIG=" + os.DevNull}, args...), "restore --local --storage-config with the API server down")
	t.Logf("restore with the API server down took %s:\n%s%s", time.Since(began).Round(time.Millisecond), r.Stdout, r.Stderr)
	began = time.Now()
	if err := sb.StartControlPlane(ctx, restored); err != nil {
		t.Fatal(err)
	}
	if err := sb.WaitForNodeReady(ctx, began); err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane back and node Ready %s after the restore", time.Since(began).Round(time.Millisecond))
}

// copyStorageConfig writes what an operator copies out of the cluster for
// the day it is down (world.BreakGlassStorageConfig).
func copyStorageConfig(t *testing.T, c *cluster, product *world.Product) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path, err := world.BreakGlassStorageConfig(ctx, c.kubectl, product, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func mustCreateConfigMap(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm, err := sb.Client().CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"made": name},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// currentResourceVersion is the resourceVersion of a fresh list: the
// newest any client can have seen.
func currentResourceVersion(ctx context.Context, t *testing.T, sb *sandbox.Sandbox) int64 {
	t.Helper()
	l, err := sb.Client().CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	return resourceVersion(t, l.ResourceVersion)
}

func resourceVersion(t *testing.T, rv string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", rv, err)
	}
	return n
}

func pauseDeployment(sb *sandbox.Sandbox, ns, name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{
						Name: "pause", Image: sb.PauseImage(), ImagePullPolicy: corev1.PullNever,
					}},
				},
			},
		},
	}
}

// deletedPodIsReplaced deletes a pod of Deployment app in ns and waits
// for another, Ready: the controllers and the node work.
func deletedPodIsReplaced(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns, app string) {
	t.Helper()
	cs := sb.Client()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("pods of the Deployment: %v %v", pods, err)
	}
	old := pods.Items[0].Name
	if err := cs.CoreV1().Pods(ns).Delete(ctx, old, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.Name != old && p.DeletionTimestamp == nil && podReady(&p) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("the Deployment did not replace pod %s: %v", old, err)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
