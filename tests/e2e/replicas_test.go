package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// haNamespace is where testReplicas installs the HA layout.
const haNamespace = "team-ha"

// testReplicas installs the product with the HA component
// (manifests/components/ha: two replicas, a rolling update, a
// PodDisruptionBudget, the shared claim) in a namespace of its own, as an
// overlay of a user would, and shows what two replicas must agree on
// through the real API server's Leases: one upload name sent to both at
// once is one backup, and a download whose replica is deleted mid-transfer
// finishes on the other at once, bytes equal. The sandbox gets its second
// node first (sandbox.AddNode): the replicas spread across the two, and a
// drain of a node during a backup and a download costs neither.
func testReplicas(ctx context.Context, t *testing.T, c *cluster, root string) {
	began := time.Now()
	if _, err := c.sb.AddNode(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("second node %s Ready in %v", sandbox.Node2Name, time.Since(began).Round(10*time.Millisecond))
	overlay := namespaceOverlay(t, root, haNamespace, "manifests/components/ha")
	slowTarget(ctx, t, c, overlay)
	mustSucceed(t, c.run(t, nil, "apply", "-k", overlay), "kubectl apply -k with components/ha")
	waitServerAvailable(ctx, t, c.sb, haNamespace)
	pods := readyServerPods(ctx, t, c, haNamespace)
	if len(pods) != 2 {
		t.Fatalf("%d ready server pods in %s, want 2", len(pods), haNamespace)
	}
	if pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		t.Errorf("both replicas on node %s: the HA layout spreads them", pods[0].Spec.NodeName)
	}
	if pdb, err := c.sb.Client().PolicyV1().PodDisruptionBudgets(haNamespace).Get(ctx, "etcdbackup-server", metav1.GetOptions{}); err != nil || pdb.Status.DisruptionsAllowed != 1 {
		t.Fatalf("PodDisruptionBudget: %v (allowed %d), want one disruption allowed of two replicas", err, pdb.Status.DisruptionsAllowed)
	}

	t.Run("same-upload-name", func(t *testing.T) { testSameUploadName(ctx, t, c, pods) })
	want := uploadBig(ctx, t, c)
	t.Run("download-across-pod-deletion", func(t *testing.T) { testDownloadAcrossDeletion(ctx, t, c, want) })
	t.Run("eviction-held-by-budget", func(t *testing.T) { testEvictionHeldByBudget(ctx, t, c, want) })
	t.Run("backup-agent-evicted", func(t *testing.T) { testBackupAgentEvicted(ctx, t, c) })
	t.Run("drain-during-backup-and-download", func(t *testing.T) { testDrain(ctx, t, c, want) })
}

// testDrain: `kubectl drain` of the node that holds the replicas — both,
// so that the PodDisruptionBudget has one to hold — while a 1 GiB
// download and a backup run. The drain evicts one replica, is refused the
// other until a replacement is ready on the other node, then evicts it
// too; the download follows the replicas and finishes, bytes equal; the
// backup completes (its agent, if it ran there, is replaced); the node is
// left with no replica.
func testDrain(ctx context.Context, t *testing.T, c *cluster, want string) {
	// Both replicas onto node 2: node 0 cordoned, its replica deleted.
	// CoreDNS stays on node 0, which the drain leaves alone.
	mustSucceed(t, c.run(t, nil, "cordon", sandbox.NodeName), "kubectl cordon")
	for _, p := range readyServerPods(ctx, t, c, haNamespace) {
		if p.Spec.NodeName == sandbox.NodeName {
			if err := c.sb.Client().CoreV1().Pods(haNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(ctx, t, 2*time.Minute, "both replicas ready on "+sandbox.Node2Name, func() bool {
		pods := readyServerPods(ctx, t, c, haNamespace)
		return len(pods) == 2 && pods[0].Spec.NodeName == sandbox.Node2Name && pods[1].Spec.NodeName == sandbox.Node2Name
	})
	mustSucceed(t, c.run(t, nil, "uncordon", sandbox.NodeName), "kubectl uncordon")
	defer c.run(t, nil, "uncordon", sandbox.Node2Name)

	backup := make(chan world.Result, 1)
	go func() {
		backup <- c.kubectl.Run(ctx, "etcdbackup", "-n", haNamespace, "backup", "--target", "ha-slow", "--name", "drained", "--wait")
	}()
	agent := waitAgentStreaming(ctx, t, c)
	// Read at 24 MiB/s, the download lasts the drain.
	d := startSlowDownload(ctx, t, c, 24<<20)
	drained := make(chan world.Result, 1)
	began := time.Now()
	go func() {
		drained <- c.kubectl.Run(ctx, "drain", sandbox.Node2Name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3m")
	}()
	if got, stderr := d.wait(t); got != want {
		t.Fatalf("downloaded sha256 %s, want %s", got, want)
	} else if !strings.Contains(stderr, "on another replica") {
		t.Errorf("the download did not move to another replica during the drain:\n%s", stderr)
	}
	r := <-drained
	if r.ExitCode != 0 {
		t.Fatalf("kubectl drain %s: %s", sandbox.Node2Name, r)
	}
	t.Logf("drain of %s took %v (the backup's agent ran on %s)", sandbox.Node2Name, time.Since(began).Round(time.Second), agent.Spec.NodeName)
	if !strings.Contains(r.Stdout+r.Stderr, "disruption budget") {
		t.Errorf("the drain was never held by the PodDisruptionBudget:\n%s", r)
	}
	if b := <-backup; b.ExitCode != 0 {
		t.Fatalf("backup across the drain: %s", b)
	}
	mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", haNamespace, "verify", "drained"), "verify drained")
	waitServerAvailable(ctx, t, c.sb, haNamespace)
	pods := readyServerPods(ctx, t, c, haNamespace)
	if len(pods) != 2 || pods[0].Spec.NodeName != sandbox.NodeName || pods[1].Spec.NodeName != sandbox.NodeName {
		t.Errorf("after the drain: %d ready replicas, want 2 on %s", len(pods), sandbox.NodeName)
	}
}

// slowDownload is `kubectl etcdbackup download big -o -` read at a set
// rate: a download that outlasts what the test does meanwhile.
type slowDownload struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	sum    chan string
}

// startSlowDownload starts it and returns once 64 MiB have been read.
func startSlowDownload(ctx context.Context, t *testing.T, c *cluster, bytesPerSecond int) *slowDownload {
	t.Helper()
	d := &slowDownload{sum: make(chan string, 1)}
	d.cmd = c.kubectl.Command(ctx, "etcdbackup", "-n", haNamespace, "download", "big", "-o", "-", "--raw")
	d.cmd.Stderr = &d.stderr
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	go func() {
		h := sha256.New()
		buf := make([]byte, 1<<20)
		var n int64
		notify := started
		for {
			k, err := out.Read(buf)
			h.Write(buf[:k])
			if n += int64(k); n >= 64<<20 && notify != nil {
				close(notify)
				notify = nil
			}
			if err != nil {
				break
			}
			time.Sleep(time.Duration(k) * time.Second / time.Duration(bytesPerSecond))
		}
		d.sum <- hex.EncodeToString(h.Sum(nil))
	}()
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatalf("the download did not reach 64 MiB in a minute: %s", d.stderr.String())
	}
	return d
}

// wait returns the SHA-256 of what was downloaded and the plugin's
// stderr, failing t if the plugin failed.
func (d *slowDownload) wait(t *testing.T) (string, string) {
	t.Helper()
	sum := <-d.sum
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("download: %v\n%s", err, d.stderr.String())
	}
	t.Logf("download: %s", strings.TrimSpace(d.stderr.String()))
	return sum, d.stderr.String()
}

// waitAgentStreaming waits until the one backup agent in the HA
// namespace says its snapshot starts, and returns its pod.
func waitAgentStreaming(ctx context.Context, t *testing.T, c *cluster) corev1.Pod {
	t.Helper()
	var agent corev1.Pod
	pollUntil(ctx, t, "a backup agent streaming", func() bool {
		pods, err := c.sb.Client().CoreV1().Pods(haNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=backup-agent"})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			log, err := c.sb.Client().CoreV1().Pods(haNamespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err == nil && bytes.Contains(log, []byte("snapshot starting")) {
				agent = p
				return true
			}
		}
		return false
	})
	return agent
}

// slowKeys is how many 1 KB values the ha-slow target holds.
const slowKeys = 1500

// slowTarget gives the HA install a target, ha-slow, whose etcd sends
// its ≈ 1.5 MB snapshot at 64 KiB/s (≈ 25 s), and writes the install's
// config into overlay: the HA component's, with the target.
func slowTarget(ctx context.Context, t *testing.T, c *cluster, overlay string) {
	t.Helper()
	ms := newMembers(t, 1)
	startMembers(t, ms)
	ec := etcdClient(t, ms)
	for i := range slowKeys {
		put(t, ec, fmt.Sprintf("/slow/%04d", i), strings.Repeat("s", 1000))
	}
	if err := c.sb.ExposeHostService(ctx, "kube-system", "ha-slow", 2379, startSlowProxy(t, ms[0].clientURL.Host, 64<<10)); err != nil {
		t.Fatal(err)
	}
	config := `apiVersion: v1
kind: ConfigMap
metadata:
  name: etcdbackup-config
data:
  config.yaml: |
    replicas: 2
    locations:
      - name: default
        filesystem:
          path: /var/lib/etcdbackup
          sharedVolume: true
    targets:
      - name: ha-slow
        endpoints: [http://ha-slow.kube-system.svc:2379]
        insecurePlaintext: true
    agents:
      serviceAccount: etcdbackup-agent
`
	if err := os.WriteFile(filepath.Join(overlay, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(overlay, "kustomization.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("  - path: config.yaml\n"); err != nil {
		t.Fatal(err)
	}
}

// testBackupAgentEvicted: the pod of a backup agent is evicted while it
// uploads, as a node drain evicts it. Its Job starts another pod, which
// takes the backup again; the backup completes with every key, and the
// cut-off upload left no claim on the name behind.
func testBackupAgentEvicted(ctx context.Context, t *testing.T, c *cluster) {
	done := make(chan world.Result, 1)
	go func() {
		done <- c.kubectl.Run(ctx, "etcdbackup", "-n", haNamespace, "backup", "--target", "ha-slow", "--name", "evicted", "--wait")
	}()
	// The snapshot streams for ≈ 25 s once the agent says it starts.
	first := waitAgentStreaming(ctx, t, c)
	if err := c.sb.Client().PolicyV1().Evictions(haNamespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Namespace: haNamespace, Name: first.Name}}); err != nil {
		t.Fatalf("evict the backup agent %s: %v", first.Name, err)
	}
	var res world.Result
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if res.ExitCode != 0 {
		t.Fatalf("backup --wait across the eviction of its agent %s: %s", first.Name, res)
	}
	pods, err := c.sb.Client().CoreV1().Pods(haNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=backup-agent"})
	if err != nil {
		t.Fatal(err)
	}
	// The backup is stored before its agent exits: the new pod may still
	// run.
	if len(pods.Items) != 1 || pods.Items[0].UID == first.UID {
		t.Errorf("agent pods after %s was evicted: %d, want one other", first.Name, len(pods.Items))
	}
	r := mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", haNamespace, "get", "evicted", "-o", "jsonpath={.status.phase} {.status.etcd.totalKeys}"), "get evicted")
	var phase string
	var keys int
	if _, err := fmt.Sscan(r.Stdout, &phase, &keys); err != nil || phase != "Completed" || keys < slowKeys {
		t.Fatalf("backup evicted: %q, want Completed with at least %d keys", r.Stdout, slowKeys)
	}
	mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", haNamespace, "verify", "evicted"), "verify evicted")
	t.Logf("backup agent %s evicted mid-upload; its Job's next pod took the backup: %d keys", first.Name, keys)
}

// readyServerPods are the server's Ready pods in ns that are not being
// deleted, by name (the order the plugin's tunnel picks from).
func readyServerPods(ctx context.Context, t *testing.T, c *cluster, ns string) []corev1.Pod {
	t.Helper()
	list, err := c.sb.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=etcdbackup-server"})
	if err != nil {
		t.Fatal(err)
	}
	var ready []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			ready = append(ready, p)
		}
	}
	slices.SortFunc(ready, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return ready
}

// portForward forwards a local port to port of target (e.g. pod/NAME)
// in ns with the real kubectl until the test ends, and returns the local
// address.
func portForward(ctx context.Context, t *testing.T, k *world.Kubectl, ns, target string, port int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := k.Command(ctx, "-n", ns, "port-forward", target, fmt.Sprintf(":%d", port), "--address", "127.0.0.1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &testLog{t: t, prefix: "port-forward: "}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	re := regexp.MustCompile(fmt.Sprintf(`Forwarding from 127\.0\.0\.1:(\d+) -> %d`, port))
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return "127.0.0.1:" + m[1]
		}
	}
	t.Fatalf("kubectl port-forward to %s port %d ended: %v", target, port, sc.Err())
	return ""
}

// userPort is the server's user API port (the container port "grpc").
const userPort = 50051

// gatedReader reads r, but stops after the first after bytes until open
// is closed; reached is closed when it gets there.
type gatedReader struct {
	r       io.Reader
	after   int64
	n       int64
	reached chan struct{}
	open    chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.n >= g.after {
		select {
		case <-g.reached:
		default:
			close(g.reached)
		}
		<-g.open
	} else if rest := g.after - g.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := g.r.Read(p)
	g.n += int64(n)
	return n, err
}

// testSameUploadName: an upload of one name to each replica at once.
// The first is held mid-stream; the second, on the other replica, is
// refused at once, naming the replica that has the name; the first then
// completes, and the backup is its bytes.
func testSameUploadName(ctx context.Context, t *testing.T, c *cluster, pods []corev1.Pod) {
	clients := make([]*client.Client, 2)
	for i, p := range pods {
		conn, cl, err := client.Dial(portForward(ctx, t, c.kubectl, haNamespace, "pod/"+p.Name, userPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients[i] = cl
	}
	first, second := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(8<<20)), etcdtest.TrailedBytes(t, etcdtest.TrailedSize(4<<20))
	gate := &gatedReader{r: bytes.NewReader(first), after: 2 << 20, reached: make(chan struct{}), open: make(chan struct{})}
	uploaded := make(chan error, 1)
	go func() {
		_, err := clients[0].Upload(ctx, gate, &ebv1.UploadHeader{Name: "same-name"}, nil)
		uploaded <- err
	}()
	select {
	case <-gate.reached:
	case err := <-uploaded:
		t.Fatalf("the first upload ended before it was held: %v", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	_, err := clients[1].Upload(ctx, bytes.NewReader(second), &ebv1.UploadHeader{Name: "same-name"}, nil)
	if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "in progress") || !strings.Contains(err.Error(), pods[0].Name) {
		t.Errorf("the same name on the other replica while the first uploads: %v; want AlreadyExists naming replica %s", err, pods[0].Name)
	}
	close(gate.open)
	if err := <-uploaded; err != nil {
		t.Fatalf("the first upload: %v", err)
	}
	r := mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", haNamespace, "list", "-o", "name"), "list")
	if n := strings.Count(r.Stdout, "same-name"); n != 1 {
		t.Fatalf("list shows same-name %d times:\n%s", n, r.Stdout)
	}
	out := filepath.Join(t.TempDir(), "same-name.db")
	mustSucceed(t, c.run(t, nil, "etcdbackup", "-n", haNamespace, "download", "same-name", "-o", out, "--raw"), "download same-name")
	mustEqualFile(t, out, first)
	// Released: no coordination Lease is left behind.
	leases, err := c.sb.Client().CoordinationV1().Leases(haNamespace).List(ctx, metav1.ListOptions{LabelSelector: "etcdbackup.io/coordination"})
	if err != nil || len(leases.Items) != 0 {
		t.Errorf("coordination Leases left after the uploads: %v, %v", leases, err)
	}
}

// uploadBig stores a 1 GiB backup "big" through the second replica and
// returns its SHA-256.
func uploadBig(ctx context.Context, t *testing.T, c *cluster) string {
	pods := readyServerPods(ctx, t, c, haNamespace)
	conn, cl, err := client.Dial(portForward(ctx, t, c.kubectl, haNamespace, "pod/"+pods[len(pods)-1].Name, userPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(1<<30))
	if _, err := cl.Upload(ctx, bytes.NewReader(data), &ebv1.UploadHeader{Name: "big"}, nil); err != nil {
		t.Fatalf("upload 1 GiB: %v", err)
	}
	return sha(data)
}

// downloadAcross downloads "big" with the plugin and, once 64 MiB have
// arrived, calls disrupt with the replica serving it (the plugin takes the
// first ready replica by name) and the other. The download must finish,
// bytes equal (want is their SHA-256), on the other replica; it returns
// how long after disrupt the other replica served the rest.
func downloadAcross(ctx context.Context, t *testing.T, c *cluster, want string, disrupt func(serving, other corev1.Pod)) time.Duration {
	t.Helper()
	waitServerAvailable(ctx, t, c.sb, haNamespace)
	pods := readyServerPods(ctx, t, c, haNamespace)
	if len(pods) != 2 {
		t.Fatalf("%d ready server pods, want 2", len(pods))
	}
	d := startBigDownload(ctx, t, c)
	defer d.cancel()
	disrupted := time.Now()
	disrupt(pods[0], pods[1])
	d.finish(t, want)
	resumed := resumedAt(ctx, t, c, pods[1].Name, disrupted)
	if resumed.IsZero() {
		t.Fatalf("replica %s has no download of big from past byte 0 in its log: the download did not move", pods[1].Name)
	}
	pause := resumed.Sub(disrupted)
	if pause > 10*time.Second {
		t.Errorf("the download resumed on %s %v after %s went, want within seconds", pods[1].Name, pause, pods[0].Name)
	}
	return pause
}

// bigDownload is the plugin's download of "big" under way.
type bigDownload struct {
	cmd    *exec.Cmd
	out    string
	stderr bytes.Buffer
	cancel context.CancelFunc
}

// startBigDownload starts `kubectl etcdbackup download big` and returns
// once 64 MiB have arrived.
func startBigDownload(ctx context.Context, t *testing.T, c *cluster) *bigDownload {
	t.Helper()
	d := &bigDownload{out: filepath.Join(t.TempDir(), "big.db")}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	d.cancel = cancel
	d.cmd = c.kubectl.Command(dctx, "etcdbackup", "-n", haNamespace, "download", "big", "-o", d.out, "--raw")
	d.cmd.Stderr = &d.stderr
	if err := d.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	pollUntil(ctx, t, "the download under way", func() bool {
		for _, p := range []string{d.out, d.out + ".part"} {
			if fi, err := os.Stat(p); err == nil && fi.Size() >= 64<<20 {
				return true
			}
		}
		return false
	})
	// The download is marked where the other replica's retention sees it.
	if sends, err := c.sb.Client().CoordinationV1().Leases(haNamespace).List(ctx, metav1.ListOptions{LabelSelector: "etcdbackup.io/coordination=send"}); err != nil || len(sends.Items) == 0 {
		t.Errorf("no send Lease while the download runs: %v, %v", sends, err)
	}
	return d
}

// finish waits for the download to end and checks its bytes' SHA-256.
func (d *bigDownload) finish(t *testing.T, want string) {
	t.Helper()
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("download: %v\n%s", err, d.stderr.String())
	}
	t.Logf("download: %s", strings.TrimSpace(d.stderr.String()))
	f, err := os.Open(d.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := shaReader(t, f); got != want {
		t.Fatalf("downloaded sha256 %s, want %s", got, want)
	}
}

// testDownloadAcrossDeletion: the replica serving a 1 GiB download is
// deleted mid-transfer. It hands the download off, the plugin's next dial
// goes to the other replica, and the download finishes there.
func testDownloadAcrossDeletion(ctx context.Context, t *testing.T, c *cluster, want string) {
	pause := downloadAcross(ctx, t, c, want, func(serving, other corev1.Pod) {
		if err := c.sb.Client().CoreV1().Pods(haNamespace).Delete(ctx, serving.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("replica deleted mid-download: resumed on the other %v later", pause.Round(time.Millisecond))
}

// testEvictionHeldByBudget: as `kubectl drain` does, with the node
// cordoned so that no replacement can start, both replicas are evicted
// while a download runs. The PodDisruptionBudget lets the first go — the
// download moves to the other — and refuses the second, which serves on.
// Both nodes are cordoned.
func testEvictionHeldByBudget(ctx context.Context, t *testing.T, c *cluster, want string) {
	mustSucceed(t, c.run(t, nil, "cordon", sandbox.NodeName, sandbox.Node2Name), "kubectl cordon")
	defer func() {
		mustSucceed(t, c.run(t, nil, "uncordon", sandbox.NodeName, sandbox.Node2Name), "kubectl uncordon")
	}()
	evict := func(p corev1.Pod) error {
		return c.sb.Client().PolicyV1().Evictions(haNamespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Namespace: haNamespace, Name: p.Name}})
	}
	var refused error
	pause := downloadAcross(ctx, t, c, want, func(serving, other corev1.Pod) {
		if err := evict(serving); err != nil {
			t.Fatalf("evict %s, the first of two replicas: %v", serving.Name, err)
		}
		refused = evict(other)
	})
	if !apierrors.IsTooManyRequests(refused) || !strings.Contains(refused.Error(), "disruption budget") {
		t.Errorf("evicting the second replica while the first is gone: %v, want refused by the PodDisruptionBudget", refused)
	}
	if pods := readyServerPods(ctx, t, c, haNamespace); len(pods) != 1 {
		all, _ := c.sb.Client().CoreV1().Pods(haNamespace).List(ctx, metav1.ListOptions{})
		var b strings.Builder
		for _, p := range all.Items {
			fmt.Fprintf(&b, "%s created %s deleting %v phase %s node %q\n", p.Name, p.CreationTimestamp, p.DeletionTimestamp, p.Status.Phase, p.Spec.NodeName)
		}
		node, _ := c.sb.Client().CoreV1().Nodes().Get(ctx, sandbox.NodeName, metav1.GetOptions{})
		t.Errorf("%d ready replicas while the node is cordoned (unschedulable %v), want the one the budget kept:\n%s", len(pods), node.Spec.Unschedulable, b.String())
	}
	t.Logf("replica evicted mid-download (the other held by the PodDisruptionBudget): resumed %v later", pause.Round(time.Millisecond))
}

// resumedAt is when pod logged a download of "big" from past byte 0,
// after since.
func resumedAt(ctx context.Context, t *testing.T, c *cluster, pod string, since time.Time) time.Time {
	t.Helper()
	b, err := c.sb.Client().CoreV1().Pods(haNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "server"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var rec struct {
			Time   time.Time `json:"time"`
			Msg    string    `json:"msg"`
			Backup string    `json:"backup"`
			Offset int64     `json:"offset"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "backup download" && rec.Backup == "big" && rec.Offset > 0 && rec.Time.After(since) {
			return rec.Time
		}
	}
	return time.Time{}
}

func shaReader(t *testing.T, r io.Reader) string {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
