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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebsnapshot "github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// The product as installed by `make sandbox`: `kubectl etcdbackup backup
// --wait` makes the server create an agent Job, the node runs it, the
// backup is listed Completed, and a download through the tunnel is the
// etcd the agent read.
func TestBackupFromCluster(t *testing.T) {
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}

	// A quiet etcd of the test's own: its content does not move, so the
	// download can be compared with etcd's own snapshot of it.
	quiet := newMembers(t, 1)
	startMembers(t, quiet)
	ec := etcdClient(t, quiet)
	for i := 0; i < 100; i++ {
		put(t, ec, fmt.Sprintf("/quiet/%03d", i), strings.Repeat("q", 1000))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	product, err := world.InstallProduct(ctx, sb, k, im, t.TempDir(), &testLog{t: t, prefix: "install: "},
		world.PlainTarget{Name: "quiet", Addr: quiet[0].clientURL.Host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)

	t.Run("control-plane-into-s3", func(t *testing.T) {
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "control-plane", "--location", "s3", "--name", "cp", "--wait"), "backup --wait")
		if !strings.Contains(r.Stdout, "Completed") {
			t.Fatalf("backup --wait: %s", r)
		}
		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "--location", "s3", "-o", "wide"), "list")
		if !strings.Contains(r.Stdout, "cp ") || !strings.Contains(r.Stdout, "agent:control-plane") {
			t.Fatalf("list: %s", r)
		}
		// The agent ran from its image.
		pods, err := sb.Client().CoreV1().Pods(world.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=backup-agent"})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("agent pods: %v %v", pods, err)
		}
		checkImage(t, &pods.Items[0], im.Digests[im.Agent])
		// The Job ran under the agent's ServiceAccount, without a token,
		// mounting only the TLS Secret, and its log is readable both ways.
		jobs := mustSucceed(t, c.run(t, nil, "-n", world.DefaultNamespace, "get", "jobs", "-l", "app.kubernetes.io/component=backup-agent", "-o", "yaml"), "get jobs")
		for _, want := range []string{"serviceAccountName: etcdbackup-agent", "automountServiceAccountToken: false", "secretName: etcd-client"} {
			if !strings.Contains(jobs.Stdout, want) {
				t.Errorf("agent Job lacks %q", want)
			}
		}
		for _, secret := range []string{product.S3.SecretAccessKey, product.S3.AccessKeyID} {
			if strings.Contains(jobs.Stdout, secret) {
				t.Errorf("a storage credential appears in the agent Job's spec")
			}
		}
		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "logs", "cp", "--location", "s3"), "etcdbackup logs")
		if !strings.Contains(r.Stdout, "backup stored") {
			t.Fatalf("etcdbackup logs: %s", r)
		}
		mustSucceed(t, c.run(t, nil, "etcdbackup", "verify", "cp", "--location", "s3"), "verify")
		if uploads, err := product.S3.OpenMultipartUploads(ctx); err != nil || len(uploads) != 0 {
			t.Fatalf("multipart uploads left open: %v %v", uploads, err)
		}
	})

	t.Run("quiet-etcd-matches", func(t *testing.T) {
		mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "quiet", "--name", "q", "--compression", "zstd", "--wait"), "backup --wait")
		dir := t.TempDir()
		out := filepath.Join(dir, "q.zst")
		mustSucceed(t, c.run(t, nil, "etcdbackup", "download", "q", "-o", out), "download")
		db, err := ebsnapshot.Unpack(ctx, out, dir)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ebsnapshot.Check(db)
		if err != nil {
			t.Fatal(err)
		}
		ref := filepath.Join(dir, "ref.db")
		if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), etcdClientConfig(quiet[0]), ref); err != nil {
			t.Fatal(err)
		}
		want, err := ebsnapshot.Check(ref)
		if err != nil {
			t.Fatal(err)
		}
		if got.Revision != want.Revision || got.Hash != want.Hash || got.TotalKey != want.TotalKey {
			t.Fatalf("downloaded backup: revision %d hash %d keys %d; etcd's own snapshot: revision %d hash %d keys %d",
				got.Revision, got.Hash, got.TotalKey, want.Revision, want.Hash, want.TotalKey)
		}
	})

	t.Run("etcd-down-is-failed", func(t *testing.T) {
		stopMembers(quiet)
		r := mustFail(t, c.run(t, nil, "etcdbackup", "backup", "--target", "quiet", "--name", "down", "--wait", "--timeout", "2m"), "backup of a stopped etcd")
		if !strings.Contains(r.Stderr, "failed") || !strings.Contains(r.Stderr, "kubectl etcdbackup logs down") {
			t.Fatalf("failure does not explain: %s", r)
		}
		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "list"), "list")
		if !strings.Contains(r.Stdout, "down") || !strings.Contains(r.Stdout, "Failed") {
			t.Fatalf("list does not show the failed backup: %s", r)
		}
		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "get", "down", "-o", "json"), "get")
		if !strings.Contains(r.Stdout, `"message"`) {
			t.Fatalf("failed backup has no reason: %s", r)
		}
		r = mustFail(t, c.run(t, nil, "etcdbackup", "download", "down", "-o", filepath.Join(t.TempDir(), "x")), "download of a failed backup")
		if !strings.Contains(r.Stderr, "failed") {
			t.Fatalf("download of a failed backup: %s", r)
		}
	})

	// Every sh block of docs/scripting.md, in the page's order, as a user's
	// shell runs it against this cluster: real kubectl, the real plugin,
	// jq. The page's backups exist: control-plane ones (cp, q is another
	// target), a Failed one (down), before-upgrade and two env=test ones.
	t.Run("scripting-doc", func(t *testing.T) {
		dir := t.TempDir()
		sizes := map[string]int{}
		for _, up := range []struct{ name, location, labels string }{
			{"before-upgrade", "default", "env=prod"}, {"t1", "default", "env=test"}, {"t2", "s3", "env=test"},
		} {
			f := filepath.Join(dir, up.name+".db")
			sizes[up.name] = len(writeSnapshotFile(t, f, 4096))
			mustSucceed(t, c.run(t, nil, "etcdbackup", "upload", f, "--name", up.name, "--location", up.location, "--labels", up.labels), "upload "+up.name)
		}
		root, err := world.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		blocks := shBlocks(t, filepath.Join(root, "docs", "scripting.md"))
		if len(blocks) < 10 {
			t.Fatalf("docs/scripting.md has %d sh blocks; the page and this test disagree", len(blocks))
		}
		for _, b := range blocks {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			cmd := k.Shell(sctx, b)
			cmd.Dir = dir
			r := world.RunCommand(cmd)
			cancel()
			if r.ExitCode != 0 {
				t.Errorf("docs/scripting.md block failed:\n%s\n%s", b, r)
				continue
			}
			switch {
			case strings.HasPrefix(b, "kubectl etcdbackup list -o name"):
				if !strings.Contains(r.Stdout, "backup/before-upgrade") || !strings.Contains(r.Stdout, "backup/cp") {
					t.Errorf("%s: %s", b, r)
				}
			case strings.Contains(b, "select(.status.phase == \"Failed\")"):
				if !strings.Contains(r.Stdout, "down: ") {
					t.Errorf("%s: %s", b, r)
				}
			case strings.HasPrefix(b, "kubectl etcdbackup get before-upgrade -o jsonpath='{.status.sizeBytes}'"):
				if strings.TrimSpace(r.Stdout) != strconv.Itoa(sizes["before-upgrade"]) {
					t.Errorf("%s: %s", b, r)
				}
			}
		}
		// The page's download of the newest Completed control-plane backup
		// is a plain etcd snapshot.
		if _, err := ebsnapshot.Check(filepath.Join(dir, "newest.db")); err != nil {
			t.Errorf("newest.db from docs/scripting.md: %v", err)
		}
	})
}

// shBlocks returns the bodies of a Markdown page's ```sh blocks.
func shBlocks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case !in && strings.HasPrefix(l, "```sh"):
			in, cur = true, nil
		case in && strings.HasPrefix(l, "```"):
			in = false
			blocks = append(blocks, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, l)
		}
	}
	return blocks
}

func etcdClientConfig(m *etcdMember) clientv3.Config {
	return clientv3.Config{Endpoints: []string{m.clientURL.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
}
