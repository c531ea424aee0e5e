// Tests of the liveness probe as a restore meets it: RestoreBackup refuses
// while a member runs or cannot be told stopped, naming what it saw.

package liveness_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/liveness"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// hushURL accepts connections and never says a word: a member that may be
// hung, or a path that swallows packets.
func hushURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { <-done; c.Close() }()
		}
	}()
	return "http://" + l.Addr().String()
}

func claimPod(ns, name, claim string, phase corev1.PodPhase, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
		}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func refusal(t *testing.T, w *servertest.RestoreWorld) string {
	t.Helper()
	_, err := w.Server.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore: %v, want FailedPrecondition", err)
	}
	if j := w.Jobs(t); len(j) != 0 {
		t.Fatalf("a refused restore created %d jobs", len(j))
	}
	return status.Convert(err).Message()
}

func TestRestoreRefusedWhileAMemberAnswers(t *testing.T) {
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"etcdserver":"3.7.3"}`)) }))
	defer live.Close()
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t), live.URL, servertest.SilentURL(t))
	_, err := w.Server.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore while m1 answers: %v, want FailedPrecondition", err)
	}
	msg := status.Convert(err).Message()
	for _, want := range []string{"m1 (" + live.URL + ")", "scale statefulset", "/etc/kubernetes/manifests"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "m0") || strings.Contains(msg, "m2") {
		t.Errorf("refusal names stopped members: %q", msg)
	}
	if j := w.Jobs(t); len(j) != 0 {
		t.Fatalf("a refused restore created %d jobs", len(j))
	}

	// A dry run shows the plan, marks the running member, creates nothing.
	resp, err := w.Server.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetMembers()) != 3 || !strings.Contains(resp.GetMembers()[1].GetMessage(), "still answers") || resp.GetMembers()[0].GetMessage() != "" {
		t.Fatalf("dry run plan: %v", resp)
	}
	if j := w.Jobs(t); len(j) != 0 {
		t.Fatalf("a dry run created %d jobs", len(j))
	}
}

func TestRestoreProbeSeesTLSMembers(t *testing.T) {
	live := httptest.NewUnstartedServer(http.NotFoundHandler())
	live.TLS = nil
	live.StartTLS()
	defer live.Close()
	w := servertest.NewRestoreWorld(t, live.URL)
	if !strings.HasPrefix(live.URL, "https://") {
		t.Fatalf("not a TLS URL: %s", live.URL)
	}
	_, err := w.Server.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore while a TLS member answers: %v", err)
	}
}

// A member whose URL refuses connections still runs when the API shows a
// pod mounting its claim; the refusal names that pod. Finished pods and
// the server's own restore agents do not count.
func TestRestoreRefusedWhileAPodMountsTheClaim(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t), servertest.ClosedURL(t))
	ctx := context.Background()
	agent := map[string]string{jobs.LabelManagedBy: jobs.ManagedBy, jobs.LabelComponent: jobs.ComponentRestore}
	for _, p := range []*corev1.Pod{
		claimPod("app", "etcd-1-abc", "data-m1", corev1.PodRunning, nil),
		claimPod("app", "old-etcd-0", "data-m0", corev1.PodSucceeded, nil),
		claimPod("app", "restore-m0-x", "data-m0", corev1.PodRunning, agent),
		claimPod("other", "elsewhere", "data-m0", corev1.PodRunning, nil),
	} {
		if _, err := w.Clientset.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	msg := refusal(t, w)
	servertest.MustSay(t, msg, "still running", "m1 (pod app/etcd-1-abc uses pvc/data-m1)", "--replicas=0", "/etc/kubernetes/manifests")
	if strings.Contains(msg, "m0") {
		t.Errorf("refusal names m0, whose only pods are finished, a restore agent, or in another namespace: %q", msg)
	}
	resp, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.GetMembers(); m[0].GetMessage() != "" || !strings.Contains(m[1].GetMessage(), "pod app/etcd-1-abc") {
		t.Fatalf("dry run: %v", resp)
	}

	if err := w.Clientset.CoreV1().Pods("app").Delete(ctx, "etcd-1-abc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Server.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"}); err != nil {
		t.Fatalf("restore once the pod is gone: %v", err)
	}
}

// A client URL whose name does not resolve, or that neither answers nor
// refuses in time, leaves the member's state unknown: the restore is
// refused, naming the member, what was seen and what to check.
func TestRestoreRefusedWhenAMemberStateIsUnknown(t *testing.T) {
	defer liveness.SetProbeTimeout(300 * time.Millisecond)()
	for _, tc := range []struct {
		name string
		url  string
		want []string
	}{
		{"dns", "http://etcd-1.example.invalid:2379", []string{"m1 (http://etcd-1.example.invalid:2379 does not resolve from the server"}},
		{"silent", hushURL(t), []string{"accepts connections but sent nothing within 300ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t), tc.url)
			msg := refusal(t, w)
			servertest.MustSay(t, msg, append(tc.want, `cannot tell whether etcd of target "app" is stopped`, "m1 (", "must resolve and be reachable from the server's pod", "ClusterIP Service")...)
			if strings.Contains(msg, "m0") || strings.Contains(msg, "still running") {
				t.Errorf("refusal %q names m0 or calls m1 running", msg)
			}
			resp, err := w.Server.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			if m := resp.GetMembers(); m[0].GetMessage() != "" || !strings.Contains(m[1].GetMessage(), "cannot tell whether it runs") {
				t.Fatalf("dry run: %v", resp)
			}
		})
	}
}

// Without pods get/list in the members' namespace the server cannot see
// who uses a volume: unknown, and the refusal says which permission.
func TestRestoreRefusedWhenPodsCannotBeListed(t *testing.T) {
	w := servertest.NewRestoreWorld(t, servertest.ClosedURL(t))
	w.Clientset.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", nil)
	})
	servertest.MustSay(t, refusal(t, w), "cannot tell", "forbidden", "pods list in namespace app")
	resp, err := w.Server.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.GetMembers(); !strings.Contains(m[0].GetMessage(), "cannot tell whether it runs") {
		t.Fatalf("dry run: %v", resp)
	}
}

// hostPathWorld is a server with a two-member control-plane target.
func hostPathWorld(t *testing.T, cs *fake.Clientset) *server.Server {
	t.Helper()
	w := servertest.NewRestoreWorld(t) // for backup b1 in a location
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	target := config.Target{Name: "cp", Endpoints: []string{servertest.ClosedURL(t)}, InsecurePlaintext: true}
	for i, node := range []string{"cp-1", "cp-2"} {
		name := "m" + string(rune('0'+i))
		target.Members = append(target.Members, config.Member{
			Name: name, PeerURL: "https://" + node + ":2380", ClientURL: servertest.ClosedURL(t), DataDir: "etcd", NodeName: node,
			Volume: config.MemberVolume{HostPath: &config.HostPathRef{Path: "/var/lib"}},
		})
	}
	if err := l.Start(t.Context(), []config.Target{target}); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Locations: []server.NamedLocation{{Name: "default", Location: w.Location}},
		Targets:   []config.Target{target},
		Agents:    l,
	})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// Control-plane members: a pod on the member's node with a hostPath at,
// above or below its data directory means it runs (kubeadm's static etcd
// pod, seen through its mirror pod in kube-system); once stopped, the
// restore Jobs run in the restore namespace, not the server's restricted
// one.
func TestHostPathRestore(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	srv := hostPathWorld(t, cs)
	hostPod := func(name, node, path string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name},
			Spec: corev1.PodSpec{NodeName: node, Volumes: []corev1.Volume{{Name: "etcd-data", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: path},
			}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	for _, p := range []*corev1.Pod{
		hostPod("etcd-cp-2", "cp-2", "/var/lib/etcd"),
		hostPod("kube-proxy-cp-1", "cp-1", "/var/lib/kube-proxy"), // a sibling path: not etcd's
		hostPod("etcd-cp-3", "cp-3", "/var/lib/etcd"),             // another node
	} {
		if _, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "cp"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore while etcd-cp-2 runs: %v", err)
	}
	msg := status.Convert(err).Message()
	servertest.MustSay(t, msg, "m1 (pod kube-system/etcd-cp-2 uses hostPath cp-2:/var/lib)", "/etc/kubernetes/manifests")
	if strings.Contains(msg, "m0") {
		t.Errorf("refusal names m0: %q", msg)
	}

	if err := cs.CoreV1().Pods("kube-system").Delete(ctx, "etcd-cp-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "cp"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range resp.GetMembers() {
		if !strings.HasPrefix(m.GetJobName(), config.DefaultRestoreNamespace+"/") {
			t.Errorf("member %s: job %s, want one in namespace %s", m.GetMember(), m.GetJobName(), config.DefaultRestoreNamespace)
		}
	}
	list, err := cs.BatchV1().Jobs(config.DefaultRestoreNamespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("jobs in %s: %v %v", config.DefaultRestoreNamespace, list, err)
	}
	for _, j := range list.Items {
		if v := j.Spec.Template.Spec.Volumes[0]; v.HostPath == nil || v.HostPath.Path != "/var/lib" || j.Spec.Template.Spec.NodeName == "" {
			t.Errorf("job %s: volume %+v on node %q", j.Name, v, j.Spec.Template.Spec.NodeName)
		}
	}
}
