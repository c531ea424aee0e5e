package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clientv3 "go.etcd.io/etcd/client/v3"
	etcdsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

const restartNS = "restart-test"

// TestControlPlaneRestart restores the sandbox's etcd as a kubeadm
// operator does: snapshot etcd, stop the control plane, wipe etcd's data
// directory, restore the snapshot into a new one with etcd's own restore
// code (snapshot.Restore), start the control plane on it. The cluster is
// then the snapshot's — an object made before it is back, one made after it
// is gone — and works: the node is Ready with a fresh heartbeat, the
// controllers replace a deleted pod, a new pod runs, the real kubectl
// answers. Stop works with the control plane down.
//
// It runs a sandbox of its own, as every test of this package does: a
// restore winds the cluster back, which no other test should see.
func TestControlPlaneRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := sandbox.StartForTest(t)
	if err := s.EnsureNamespace(ctx, restartNS); err != nil {
		t.Fatal(err)
	}
	cms := s.Client().CoreV1().ConfigMaps(restartNS)
	newConfigMap := func(name string) {
		t.Helper()
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"made": name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}

	// Before the snapshot: an object and a Deployment with its pod.
	newConfigMap("before-snapshot")
	labels := map[string]string{"app": "keeper"}
	_, err := s.Client().AppsV1().Deployments(restartNS).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "keeper"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       pauseSpec(s),
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForDeploymentAvailable(ctx, restartNS, "keeper"); err != nil {
		t.Fatal(err)
	}

	work := filepath.Join(s.Dir(), "restart-test")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(work, "snapshot.db")
	tlsConfig, err := s.EtcdClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	etcdConfig := clientv3.Config{Endpoints: []string{s.EtcdEndpoint()}, TLS: tlsConfig, DialTimeout: 10 * time.Second, Logger: zap.NewNop()}
	if _, err := etcdsnapshot.SaveWithVersion(ctx, zap.NewNop(), etcdConfig, snap); err != nil {
		t.Fatalf("etcd snapshot: %v", err)
	}
	st, err := snapshot.Check(snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot at revision %d, %d keys", st.Revision, st.TotalKey)
	// After the snapshot: gone once it is restored.
	newConfigMap("after-snapshot")

	member := s.EtcdMember()
	if member.Endpoint != s.EtcdEndpoint() || member.InitialCluster != member.Name+"="+member.PeerURLs[0] || member.DataDir != filepath.Join(s.Dir(), "etcd") {
		t.Fatalf("EtcdMember() = %+v", member)
	}
	apiserverURL, apiserverPID := s.APIServerURL(), s.APIServerPID()
	controllerPIDs := []int{s.ControllerManagerPID(), s.SchedulerPID()}

	began := time.Now()
	if err := s.StopControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("StopControlPlane took %s", time.Since(began).Round(time.Millisecond))
	for _, pid := range append(controllerPIDs, apiserverPID) {
		if sandbox.Alive(pid) {
			t.Errorf("pid %d still runs after StopControlPlane", pid)
		}
	}
	for _, u := range []string{s.EtcdEndpoint(), apiserverURL} {
		if c, err := net.DialTimeout("tcp", strings.TrimPrefix(u, "https://"), time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after StopControlPlane", u)
		}
	}
	if err := s.StopControlPlane(ctx); err != nil {
		t.Errorf("StopControlPlane again: %v", err)
	}
	// The last revision the old member reached: the most any client of
	// the old cluster has seen.
	last, err := snapshot.CheckDatabase(filepath.Join(member.DataDir, "member", "snap", "db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(member.DataDir); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(s.Dir(), "etcd-restored")
	if _, err := snapshot.Restore(snap, snapshot.Member{
		Name: member.Name, InitialCluster: member.InitialCluster, InitialAdvertisePeerURLs: member.PeerURLs,
		InitialClusterToken: member.InitialClusterToken, DataDir: restored,
	}); err != nil {
		t.Fatal(err)
	}

	began = time.Now()
	if err := s.StartControlPlane(ctx, restored); err != nil {
		t.Fatal(err)
	}
	t.Logf("StartControlPlane took %s", time.Since(began).Round(time.Millisecond))
	if err := s.StartControlPlane(ctx, restored); !errors.Is(err, sandbox.ErrControlPlaneState) {
		t.Errorf("StartControlPlane on a running control plane: %v, want ErrControlPlaneState", err)
	}
	if got := s.EtcdMember(); got.DataDir != restored || got.Endpoint != member.Endpoint || got.InitialCluster != member.InitialCluster {
		t.Errorf("EtcdMember() after the restart = %+v, want %+v on %s", got, member, restored)
	}
	if s.APIServerURL() != apiserverURL || s.APIServerPID() == apiserverPID {
		t.Errorf("kube-apiserver at %s, pid %d; want a new process at %s", s.APIServerURL(), s.APIServerPID(), apiserverURL)
	}

	t.Run("snapshot-state", func(t *testing.T) {
		if _, err := cms.Get(ctx, "before-snapshot", metav1.GetOptions{}); err != nil {
			t.Errorf("the object made before the snapshot: %v", err)
		}
		if _, err := cms.Get(ctx, "after-snapshot", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the object made after the snapshot: %v, want not found", err)
		}
		out := kubectl(t, s, "-n", restartNS, "get", "configmaps", "-o", "name")
		if !strings.Contains(out, "configmap/before-snapshot") || strings.Contains(out, "after-snapshot") {
			t.Errorf("kubectl get configmaps:\n%s", out)
		}
	})
	t.Run("node-ready", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := s.WaitForNodeReady(wctx, began); err != nil {
			t.Fatal(err)
		}
		t.Logf("node Ready with a heartbeat %s after StartControlPlane began", time.Since(began).Round(time.Millisecond))
	})
	// Restored without a revision bump, etcd's revision went back to the
	// snapshot's, while the node's clients (the kubelet, kube-proxy) watch
	// on from the revision they had reached: until the new history passes
	// it, they miss what happens. The controllers do not: they started
	// afresh. Writes new clients' watches see come after that point.
	t.Run("revision-catches-up", func(t *testing.T) {
		cli, err := clientv3.New(etcdConfig)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		var rev int64
		waitUntil(wctx, t, fmt.Sprintf("etcd's revision to pass %d, the old member's last", last.Revision), func() (bool, string) {
			resp, err := cli.Get(wctx, "/registry/namespaces/"+restartNS)
			if err != nil {
				return false, err.Error()
			}
			rev = resp.Header.Revision
			return rev > last.Revision, fmt.Sprintf("revision %d", rev)
		})
		t.Logf("revision %d (snapshot %d, old member's last %d) %s after StartControlPlane began", rev, st.Revision, last.Revision, time.Since(began).Round(time.Millisecond))
	})
	t.Run("controllers-replace-pod", func(t *testing.T) {
		pods, err := s.Client().CoreV1().Pods(restartNS).List(ctx, metav1.ListOptions{LabelSelector: "app=keeper"})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 1 {
			t.Fatalf("%d keeper pods after the restore, want the snapshot's 1", len(pods.Items))
		}
		old := pods.Items[0]
		if err := s.Client().CoreV1().Pods(restartNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		waitUntil(wctx, t, "a ready keeper pod replacing "+old.Name, func() (bool, string) {
			pods, err := s.Client().CoreV1().Pods(restartNS).List(wctx, metav1.ListOptions{LabelSelector: "app=keeper"})
			if err != nil {
				return false, err.Error()
			}
			var state []string
			for _, p := range pods.Items {
				if p.UID != old.UID && p.DeletionTimestamp == nil && sandbox.PodReady(&p) {
					return true, ""
				}
				state = append(state, p.Name+" "+string(p.Status.Phase))
			}
			return false, strings.Join(state, ", ")
		})
		if err := s.WaitForDeploymentAvailable(wctx, restartNS, "keeper"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("new-pod", func(t *testing.T) {
		_, err := s.Client().CoreV1().Pods(restartNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "after-restore"},
			Spec:       pauseSpec(s),
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if _, err := s.WaitForPod(wctx, restartNS, "after-restore", sandbox.PodReady); err != nil {
			t.Fatal(err)
		}
		out := kubectl(t, s, "-n", restartNS, "get", "pod", "after-restore", "-o", "jsonpath={.status.phase}")
		if out != "Running" {
			t.Errorf("kubectl get pod after-restore: phase %q", out)
		}
	})
	t.Run("stop-with-control-plane-down", func(t *testing.T) {
		pids := append(s.ContainerPIDs(), s.NodePIDs()...)
		pids = append(pids, s.APIServerPID(), s.ControllerManagerPID(), s.SchedulerPID())
		if err := s.StopControlPlane(ctx); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("Stop with the control plane down took %s", time.Since(began).Round(time.Millisecond))
		for _, pid := range pids {
			if sandbox.Alive(pid) {
				t.Errorf("pid %d still runs after Stop", pid)
			}
		}
		if err := s.StartControlPlane(ctx, restored); !errors.Is(err, sandbox.ErrControlPlaneState) {
			t.Errorf("StartControlPlane after Stop: %v, want ErrControlPlaneState", err)
		}
	})
}

// pauseSpec runs the node's pause image: a pod that is Ready once it runs.
func pauseSpec(s *sandbox.Sandbox) corev1.PodSpec {
	return corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:            "pause",
			Image:           s.PauseImage(),
			ImagePullPolicy: corev1.PullNever,
		}},
		TerminationGracePeriodSeconds: ptr.To[int64](1),
	}
}

// waitUntil polls cond until it holds or ctx ends, failing the test then
// with cond's last description of the state.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for {
		ok, l := cond()
		if ok {
			return
		}
		last = l
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s (last: %s): %v", what, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
