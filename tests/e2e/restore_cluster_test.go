package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

var (
	etcdBinOnce sync.Once
	etcdBin     string
	etcdBinErr  error
)

// etcdImage is etcd's own server main (tests/cmd/etcd) as an image.
const etcdImage = world.AppEtcdImage

// etcdBinary builds etcd's own server main (tests/cmd/etcd) once, static,
// for the etcd image.
func etcdBinary(t *testing.T) string {
	t.Helper()
	etcdBinOnce.Do(func() {
		etcdBin, etcdBinErr = world.BuildEtcd(context.Background(), binDir)
	})
	if etcdBinErr != nil {
		t.Fatal(etcdBinErr)
	}
	return etcdBin
}

const (
	appNS      = "app"
	appTarget  = "app-etcd"
	appToken   = "app-etcd-token"
	appMembers = world.AppEtcdMembers
	appDataDir = world.AppEtcdDataDir
)

func appMember(i int) world.ClusterMember { return world.AppMember(appNS, i) }

// appCluster is the YAML of a 3-member etcd running in namespace app as
// three Deployments, each with its own PVC and ClusterIP Service, plus
// what the etcdbackup server needs there to run restore Jobs.
func appCluster(members []world.ClusterMember) string {
	return world.AppEtcdYAML(appNS, appToken, members)
}

// appClient is an etcd client to member through a port-forward to its
// Service's pod, as kubectl port-forward would open.
func appClient(t *testing.T, sb *sandbox.Sandbox, member string) *clientv3.Client {
	t.Helper()
	c, err := world.AppEtcdClient(sb.RESTConfig(), appNS, member)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitHealthy waits until member's cluster has n started members and a
// quorum read works, and returns its member list.
func waitHealthy(ctx context.Context, t *testing.T, c *clientv3.Client, n int) *clientv3.MemberListResponse {
	t.Helper()
	ml, err := world.WaitEtcdHealthy(ctx, c, n)
	if err != nil {
		t.Fatal(err)
	}
	return ml
}

func scaleApp(t *testing.T, c *cluster, replicas int) {
	t.Helper()
	args := []string{"-n", appNS, "scale", "deployment"}
	for i := 0; i < appMembers; i++ {
		args = append(args, fmt.Sprintf("etcd-%d", i))
	}
	mustSucceed(t, c.run(t, nil, append(args, fmt.Sprintf("--replicas=%d", replicas))...), "kubectl scale")
}

// replaceBackup puts backup from's content and manifest under name in the
// product's S3 location, as a writer of the bucket could, and returns a
// func that puts name's own content back.
func replaceBackup(ctx context.Context, t *testing.T, product *world.Product, name, from string) (putBack func()) {
	t.Helper()
	other, otherManifest := readStored(ctx, t, product, from)
	return rewriteStored(ctx, t, product, name, func([]byte, *storage.Manifest) ([]byte, *storage.Manifest) {
		otherManifest.Name = name
		return other, otherManifest
	})
}

// TestRestoreIntoCluster, end to end: a 3-member etcd running
// as pods on PVCs is backed up into S3, changed, stopped and wiped, then
// `kubectl etcdbackup restore --target --wait` rebuilds every member's
// volume with agent Jobs; started again, the cluster has its 3 members
// with the configured names and peer URLs, and the backup's data.
func TestRestoreIntoCluster(t *testing.T) {
	etcd := etcdBinary(t)
	// Its restore agents run in the members' namespace: the shipped
	// NetworkPolicy, patched as docs/security.md says, must let them in.
	sb, im := startSandboxEnforcing(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := sb.LoadBinaryImage(ctx, etcdImage, etcd); err != nil {
		t.Fatal(err)
	}

	var members []world.ClusterMember
	for i := 0; i < appMembers; i++ {
		members = append(members, appMember(i))
	}
	dir := t.TempDir()

	// Its backups are encrypted to an age key that never reaches the
	// server: only the restore Jobs get the identity, from a Secret the
	// operator creates in the members' namespace.
	identity, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}

	// 1. The target: three etcd pods, data on the provisioner's volumes.
	manifest := filepath.Join(dir, "app-etcd.yaml")
	if err := os.WriteFile(manifest, []byte(appCluster(members)), 0o600); err != nil {
		t.Fatal(err)
	}
	mustSucceed(t, c.run(t, nil, "apply", "-f", manifest), "kubectl apply app etcd")
	product, err := world.InstallProductWith(ctx, sb, k, dir, &testLog{t: t, prefix: "install: "}, world.ProductOptions{
		Images: im,
		ClusterTargets: []world.ClusterTarget{{Name: appTarget, Namespace: appNS, InitialClusterToken: appToken, Location: "s3", Members: members,
			AgeRecipients: []string{identity.Recipient().String()},
			// Drilled on demand here (drill_test.go); the schedule is
			// far off so that no drill runs by itself meanwhile.
			DrillSchedule: "@yearly", DrillIdentitySecret: drillIdentitySecret,
			// Applied on demand only (no schedule): drill_test.go shows
			// that it keeps the newest verified backup.
			KeepLast: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	for i := 0; i < appMembers; i++ {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := sb.WaitForDeploymentAvailable(wctx, appNS, fmt.Sprintf("etcd-%d", i)); err != nil {
			wcancel()
			t.Fatal(err)
		}
		wcancel()
	}
	ec := appClient(t, sb, "etcd-0")
	waitHealthy(ctx, t, ec, appMembers)

	// 2-4. foo=1, backup into S3, foo=2.
	put(t, ec, "foo", "1")
	r := mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", appTarget, "--name", "app-1", "--wait"), "backup --wait")
	if !strings.Contains(r.Stdout, "Completed") {
		t.Fatalf("backup --wait: %s", r)
	}
	r = mustSucceed(t, c.run(t, nil, "etcdbackup", "get", "app-1", "--location", "s3", "-o", "jsonpath={.spec.encryption}"), "backup is in s3")
	if strings.TrimSpace(r.Stdout) != "age" {
		t.Fatalf("the target's backup is not encrypted: %s", r)
	}
	put(t, ec, "foo", "2")
	// app-2 is what a writer of the bucket will try to slip in under
	// app-1's name (pinned-to-content).
	mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", appTarget, "--name", "app-2", "--wait"), "backup app-2 --wait")

	t.Run("drill", func(t *testing.T) { testDrills(ctx, t, c, product, identity.String()) })

	t.Run("refused-without-identity", func(t *testing.T) {
		r := mustFail(t, c.run(t, nil, "etcdbackup", "restore", "app-1", "--location", "s3", "--target", appTarget, "--dry-run"), "restore of an encrypted backup without its identity")
		if !strings.Contains(r.Stderr, "--identity-secret") {
			t.Errorf("refusal does not name --identity-secret: %s", r)
		}
	})
	if _, err := sb.Client().CoreV1().Secrets(appNS).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-age-key"},
		Data:       map[string][]byte{"key.txt": []byte(identity.String() + "\n")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	restoreArgs := []string{"etcdbackup", "restore", "app-1", "--location", "s3", "--target", appTarget, "--identity-secret", "etcd-age-key"}
	restoreJobs := func() string {
		return mustSucceed(t, c.run(t, nil, "-n", appNS, "get", "jobs", "-l", "app.kubernetes.io/component=restore-agent", "-o", "name"), "get restore jobs").Stdout
	}

	t.Run("refused-while-running", func(t *testing.T) {
		r := mustFail(t, c.run(t, nil, restoreArgs...), "restore while members run")
		for _, want := range []string{"still running", "etcd-0", "scale", "--replicas=0", "/etc/kubernetes/manifests"} {
			if !strings.Contains(r.Stderr, want) {
				t.Errorf("refusal does not say %q: %s", want, r)
			}
		}
		if j := restoreJobs(); strings.TrimSpace(j) != "" {
			t.Fatalf("a refused restore created jobs: %s", j)
		}
	})

	t.Run("dry-run", func(t *testing.T) {
		r := mustSucceed(t, c.run(t, nil, append(restoreArgs, "--dry-run")...), "restore --dry-run")
		ic := "etcd-0=http://etcd-0.app.svc:2380,etcd-1=http://etcd-1.app.svc:2380,etcd-2=http://etcd-2.app.svc:2380"
		for _, want := range []string{"would restore", "pvc/data-etcd-0", "pvc/data-etcd-2", ic, appToken, "still answers"} {
			if !strings.Contains(r.Stdout, want) {
				t.Errorf("dry run does not show %q: %s", want, r)
			}
		}
		if j := restoreJobs(); strings.TrimSpace(j) != "" {
			t.Fatalf("a dry run created jobs: %s", j)
		}
	})
	if t.Failed() {
		return
	}

	// 5. Stop the members and wipe their volumes.
	ec.Close()
	scaleApp(t, c, 0)
	pollUntil(ctx, t, "etcd pods gone", func() bool {
		pods, err := sb.Client().CoreV1().Pods(appNS).List(ctx, metav1.ListOptions{LabelSelector: "app=etcd"})
		return err == nil && len(pods.Items) == 0
	})
	// Until kube-proxy has dropped the members' endpoints, a connection
	// to a member's Service goes to a pod IP that is gone and gets no
	// answer, which the server must not count as stopped: wait until it
	// sees what a restore will see.
	pollUntil(ctx, t, "the server sees every member stopped", func() bool {
		r := c.run(t, nil, append(restoreArgs, "--dry-run")...)
		return r.ExitCode == 0 && !strings.Contains(r.Stdout+r.Stderr, "still answers") && !strings.Contains(r.Stdout+r.Stderr, "cannot tell")
	})
	wipe := func(ms []world.ClusterMember) {
		t.Helper()
		for _, m := range ms {
			vol, err := sb.VolumePath(ctx, appNS, m.ClaimName)
			if err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(vol)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if err := os.RemoveAll(filepath.Join(vol, e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// memberData tells whether member m's etcd data is on its volume.
	memberData := func(t *testing.T, m world.ClusterMember) error {
		t.Helper()
		vol, err := sb.VolumePath(ctx, appNS, m.ClaimName)
		if err != nil {
			t.Fatal(err)
		}
		_, err = os.Stat(filepath.Join(vol, appDataDir, "member"))
		return err
	}
	for _, m := range members {
		if err := memberData(t, m); err != nil {
			t.Fatalf("member %s wrote no data in its volume: %v", m.Name, err)
		}
	}

	// --wait reports the first member that failed; the others' Jobs may
	// still be ending, and the server refuses another restore of the same
	// backup and target until they have.
	restoreJobsEnded := func(t *testing.T) {
		t.Helper()
		pollUntil(ctx, t, "the earlier restore Jobs finished", func() bool {
			jobs, err := sb.Client().BatchV1().Jobs(appNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=restore-agent"})
			if err != nil {
				return false
			}
			// A Job has ended when its controller says so (Complete or
			// Failed, which follow the server's SuccessCriteriaMet and
			// FailureTarget), not when a pod's count moved.
			for i := range jobs.Items {
				if !jobFinished(&jobs.Items[i]) {
					return false
				}
			}
			return true
		})
	}

	t.Run("identity-secret-missing", func(t *testing.T) {
		// A mistyped --identity-secret: every agent fails at once, before
		// it touches its member, saying what to create.
		args := append(slices.Clone(restoreArgs[:len(restoreArgs)-1]), "etcd-age-kye", "--wait")
		began := time.Now()
		r := mustFail(t, c.run(t, nil, args...), "restore with a missing identity Secret")
		for _, want := range []string{"--identity-secret", "create secret generic", "nothing was restored"} {
			if !strings.Contains(r.Stderr, want) {
				t.Errorf("failure does not say %q: %s", want, r)
			}
		}
		t.Logf("restore with a missing identity Secret failed after %v", time.Since(began).Round(time.Second))
		for _, m := range members {
			if err := memberData(t, m); err != nil {
				t.Fatalf("member %s's data was touched: %v", m.Name, err)
			}
		}
		restoreJobsEnded(t)
	})

	t.Run("member-with-data-fails", func(t *testing.T) {
		// etcd-2's old data is still there: its agent refuses to write
		// over it, and --wait says which member failed and where to look.
		wipe(members[:2])
		r := mustFail(t, c.run(t, nil, append(restoreArgs, "--wait")...), "restore over etcd-2's data")
		t.Logf("restore over a member's data: %s", r.Stderr)
		for _, want := range []string{"member etcd-2 failed", "not empty", "kubectl -n app logs job/restore-etcd-2-"} {
			if !strings.Contains(r.Stderr, want) {
				t.Errorf("failure does not say %q: %s", want, r)
			}
		}
		if err := memberData(t, members[2]); err != nil {
			t.Fatalf("etcd-2's data was touched: %v", err)
		}
	})
	// The failed restore's other members may still be finishing: wait,
	// so none writes after the wipe.
	restoreJobsEnded(t)
	wipe(members)

	t.Run("pinned-to-content", func(t *testing.T) {
		// The node is cordoned, so the restore Jobs exist but their pods
		// wait: meanwhile a writer of the bucket replaces app-1.
		mustSucceed(t, c.run(t, nil, "cordon", sandbox.NodeName), "kubectl cordon")
		uncordon := func() { c.run(t, nil, "uncordon", sandbox.NodeName) }
		defer uncordon()
		mustSucceed(t, c.run(t, nil, restoreArgs...), "restore (Jobs wait for the node)")
		r := mustFail(t, c.run(t, nil, "etcdbackup", "delete", "app-1", "--location", "s3"), "delete while a restore reads it")
		if !strings.Contains(r.Stderr, "restore") {
			t.Errorf("refused delete does not name the restore: %s", r.Stderr)
		}
		putBack := replaceBackup(ctx, t, product, "app-1", "app-2")
		uncordon()
		jobs, err := sb.Client().BatchV1().Jobs(appNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=restore-agent"})
		if err != nil || len(jobs.Items) != appMembers {
			t.Fatalf("restore jobs: %v (%d)", err, len(jobs.Items))
		}
		for _, j := range jobs.Items {
			wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
			_, err := sb.WaitForJob(wctx, appNS, j.Name)
			wcancel()
			logs := c.run(t, nil, "-n", appNS, "logs", "job/"+j.Name)
			if !errors.Is(err, sandbox.ErrJobFailed) {
				t.Fatalf("restore job %s of a replaced backup: %v, want it failed\n%s", j.Name, err, logs)
			}
			if !strings.Contains(logs.Stdout+logs.Stderr, "sha256") && !strings.Contains(logs.Stdout+logs.Stderr, "SHA-256") {
				t.Errorf("job %s does not say the content changed: %s", j.Name, logs)
			}
		}
		t.Logf("restore of a replaced backup: %s", lastLines(c.run(t, nil, "-n", appNS, "logs", "job/"+jobs.Items[0].Name).Stdout, 2))
		putBack()
	})
	wipe(members)

	// 6. Restore in the cluster.
	start := time.Now()
	r = mustSucceed(t, c.run(t, nil, append(restoreArgs, "--wait")...), "restore --target --wait")
	t.Logf("restore --wait took %s: %s", time.Since(start).Round(time.Millisecond), r.Stdout)
	for _, m := range members {
		if !strings.Contains(r.Stdout, "member "+m.Name+" restored") {
			t.Errorf("restore output lacks member %s: %s", m.Name, r)
		}
	}
	jobs := mustSucceed(t, c.run(t, nil, "-n", appNS, "get", "jobs", "-l", "app.kubernetes.io/component=restore-agent", "-o", "yaml"), "get restore jobs")
	for _, want := range []string{"serviceAccountName: etcdbackup-agent", "automountServiceAccountToken: false", "claimName: data-etcd-1", "--member-name=etcd-2"} {
		if !strings.Contains(jobs.Stdout, want) {
			t.Errorf("restore Jobs lack %q", want)
		}
	}
	for _, secret := range []string{product.S3.SecretAccessKey, product.S3.AccessKeyID, identity.String()} {
		if strings.Contains(jobs.Stdout, secret) {
			t.Errorf("a storage credential or the age identity appears in a restore Job's spec")
		}
	}
	if !strings.Contains(jobs.Stdout, "secretName: etcd-age-key") {
		t.Errorf("restore Jobs do not mount the identity Secret")
	}

	// 7-8. Start the members on the restored data.
	scaleApp(t, c, 1)
	for i := 0; i < appMembers; i++ {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := sb.WaitForDeploymentAvailable(wctx, appNS, fmt.Sprintf("etcd-%d", i)); err != nil {
			wcancel()
			t.Fatal(err)
		}
		wcancel()
	}
	ec = appClient(t, sb, "etcd-1")
	defer ec.Close()
	ml := waitHealthy(ctx, t, ec, appMembers)
	if got := get(t, ec, "foo"); got != "1" {
		t.Fatalf("foo after restore = %q, want 1 (the backup's)", got)
	}
	var got, want []string
	for _, m := range ml.Members {
		got = append(got, m.Name+"="+strings.Join(m.PeerURLs, ","))
	}
	for _, m := range members {
		want = append(want, m.Name+"="+m.PeerURL)
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("member list after restore: %v, want %v", got, want)
	}
}
