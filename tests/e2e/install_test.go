package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// mirror is the registry docs/install.md and manifests/examples/kubeadm
// name the images under.
const mirror = "registry.internal/etcdbackup"

// TestInstallDoc follows docs/install.md on the sandbox, step by step, as a
// user of a kubeadm cluster would: the images under a mirror's names and
// pinned by digest, a copy of manifests/examples/kubeadm beside the
// release's source with its EDIT values filled in (the etcd client
// certificate as kubeadm lays it out, the control-plane endpoints, the S3
// store), `kubectl apply -k`, then a backup and the commands the doc shows
// after it. Where the sandbox stands in for a real cluster it says so.
func TestInstallDoc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sb, im := startSandbox(t)
	c := &cluster{sb: sb, images: im, kubectl: &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}}
	root, err := world.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ns := world.DefaultNamespace

	// 1. Carry the images in. The sandbox's node imported the archives
	// with `ctr -n k8s.io images import` (the doc's per-node path); a
	// registry mirror would serve them under its own name, by tag and by
	// digest: the node gets those names too.
	tag := refTag(im.Server)
	server, agent := mirror+"/etcdbackup-server", mirror+"/etcdbackup-agent"
	serverDigest, agentDigest := im.Digests[im.Server], im.Digests[im.Agent]
	for ref, alias := range map[string][]string{
		im.Server: {server + ":" + tag, server + "@" + serverDigest},
		im.Agent:  {agent + ":" + tag, agent + "@" + agentDigest},
	} {
		for _, a := range alias {
			if err := sb.TagImage(ctx, ref, a); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The cluster's surroundings: its etcd (a kubeadm node's IP:2379 in
	// the doc; here a Service in front of the sandbox's etcd) and an S3
	// store with its own CA.
	s3, err := world.StartS3(ctx, sb, filepath.Join(t.TempDir(), "s3"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s3.Kill)
	if err := world.ExposeEtcd(ctx, sb); err != nil {
		t.Fatal(err)
	}

	// 2. Copy the example overlay beside the release's source.
	work := t.TempDir()
	if err := os.Symlink(root, filepath.Join(work, "kubectl-etcdbackup")); err != nil {
		t.Fatal(err)
	}
	cp := exec.CommandContext(ctx, "cp", "-r", "kubectl-etcdbackup/manifests/examples/kubeadm", "my-cluster")
	cp.Dir = work
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("cp -r: %v\n%s", err, out)
	}
	overlay := filepath.Join(work, "my-cluster")

	// 3. The etcd client certificate, as kubeadm keeps it on a
	// control-plane node (/etc/kubernetes/pki/etcd/); here the sandbox
	// etcd's client certificate takes its place. And the S3 store's
	// credentials and CA.
	ca, cert, key := sb.EtcdClientTLS()
	copyFiles(t, overlay, map[string]string{
		"pki/etcd/ca.crt":                 ca,
		"pki/etcd/healthcheck-client.crt": cert,
		"pki/etcd/healthcheck-client.key": key,
		"s3/access-key-id":                s3.AccessKeyIDFile,
		"s3/secret-access-key":            s3.SecretAccessKeyFile,
		"s3/ca.crt":                       s3.CAFile,
	})

	// 4. Fill in what is marked EDIT.
	kust := filepath.Join(overlay, "kustomization.yaml")
	edit(t, kust, 2, `    newTag: "v0.1.0" # EDIT: the release (quoted: a tag may be all digits)`, "    newTag: "+strconv.Quote(tag))
	edit(t, kust, 1, "    # digest: sha256:... # pins it: the image's digest (docs/install.md)\n  - name: etcdbackup-agent",
		"    digest: "+serverDigest+"\n  - name: etcdbackup-agent")
	edit(t, kust, 1, "    # digest: sha256:... # pins it: the image's digest (docs/install.md)\npatches:",
		"    digest: "+agentDigest+"\npatches:")
	config := filepath.Join(overlay, "config.yaml")
	edit(t, config, 1, "bucket: etcd-backups # EDIT", "bucket: "+s3.Bucket)
	edit(t, config, 1, "region: us-east-1 # EDIT", "region: "+s3.Region)
	edit(t, config, 1, "endpoint: https://s3.internal.example:9000 # EDIT; remove for AWS", "endpoint: https://"+world.S3ServiceName)
	// One control-plane node: one endpoint, one member.
	edit(t, config, 1, `          - https://10.0.0.10:2379 # EDIT: cp-1
          - https://10.0.0.11:2379 # EDIT: cp-2
          - https://10.0.0.12:2379 # EDIT: cp-3
`, "          - "+world.EtcdServiceURL+"\n")
	cutFrom(t, config, "          - name: cp-2\n", "    agents:\n")
	edit(t, config, 1, "- name: cp-1 # EDIT: etcd's --name, kubeadm uses the node's name", "- name: "+sandbox.NodeName)
	edit(t, config, 1, "nodeName: cp-1 # EDIT", "nodeName: "+sandbox.NodeName)
	edit(t, config, 1, "peerURL: https://10.0.0.10:2380 # EDIT", "peerURL: https://"+sandbox.HostIP+":2380")
	edit(t, config, 1, "clientURL: https://10.0.0.10:2379 # EDIT", "clientURL: "+world.EtcdServiceURL)

	// 5. Install and wait.
	mustSucceed(t, c.run(t, nil, "apply", "-k", overlay), "kubectl apply -k my-cluster")
	mustSucceed(t, c.run(t, nil, "-n", ns, "rollout", "status", "deployment/etcdbackup-server", "--timeout=3m"), "kubectl rollout status")
	waitServerAvailable(ctx, t, sb, ns)

	pod := installedServerPod(ctx, t, sb, ns)
	wantServer, wantAgent := server+":"+tag+"@"+serverDigest, agent+":"+tag+"@"+agentDigest
	if got := pod.Spec.Containers[0].Image; got != wantServer {
		t.Errorf("server container image %q, want the mirror's %q", got, wantServer)
	}
	checkImage(t, pod, serverDigest)
	// The doc's check of the agent image the server will use.
	r := mustSucceed(t, c.run(t, nil, "-n", ns, "get", "pod", "-l", "app.kubernetes.io/name=etcdbackup-server",
		"-o", `jsonpath={.items[0].spec.initContainers[?(@.name=="`+jobs.AgentImageContainer+`")].image}`), "get the agent image")
	if strings.TrimSpace(r.Stdout) != wantAgent {
		t.Errorf("init container %s image %q, want the mirror's %q", jobs.AgentImageContainer, r.Stdout, wantAgent)
	}
	r = mustSucceed(t, c.run(t, nil, "etcdbackup", "version"), "kubectl etcdbackup version")
	if !strings.Contains(r.Stdout, "Server Version:") || !strings.Contains(r.Stdout, "s3") {
		t.Errorf("version: %s", r)
	}
	// The doc's check of the store: every step the sandbox's S3 server
	// supports passes (object lock is not asked for there).
	r = mustSucceed(t, c.run(t, nil, "etcdbackup", "location", "check", "s3"), "kubectl etcdbackup location check s3")
	for _, step := range []string{"write", "multipart write", "ranged read", "list", "conditional create", "checksums", "delete"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(step) + `\s+ok\s`).MatchString(r.Stdout) {
			t.Errorf("location check s3: step %q did not pass:\n%s", step, r.Stdout)
		}
	}

	// 6. The first backup.
	r = mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "control-plane", "--wait"), "kubectl etcdbackup backup --target control-plane --wait")
	if !strings.Contains(r.Stdout, "Completed") {
		t.Fatalf("backup --wait: %s", r)
	}
	r = mustSucceed(t, c.run(t, nil, "etcdbackup", "list"), "kubectl etcdbackup list")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "control-plane-") || !strings.Contains(lines[1], " s3 ") || !strings.Contains(lines[1], "Completed") {
		t.Fatalf("list: want one Completed backup control-plane-… in s3:\n%s", r)
	}
	name := strings.Fields(lines[1])[0]
	// The agent ran from the mirror's image, pinned by its digest: the
	// image kustomize wrote into the server's Deployment.
	pods, err := sb.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: jobs.LabelComponent + "=" + jobs.ComponentBackup})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("agent pods: %v %v", pods, err)
	}
	if got := pods.Items[0].Spec.Containers[0].Image; got != wantAgent {
		t.Errorf("agent image %q, want %q", got, wantAgent)
	}
	checkImage(t, &pods.Items[0], agentDigest)

	// 7. The restore plan of the members' layout (the restore of a
	// control plane itself runs on its nodes: docs/disaster-recovery.md).
	r = mustSucceed(t, c.run(t, nil, "etcdbackup", "restore", name, "--target", "control-plane", "--dry-run"), "restore --dry-run")
	for _, want := range []string{"member " + sandbox.NodeName, "hostPath " + sandbox.NodeName + ":/var/lib", `data dir "etcd"`, "still answers"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("restore --dry-run lacks %q:\n%s", want, r)
		}
	}

	// 8. Users: the shipped ClusterRoles bound in the server's namespace.
	mustSucceed(t, c.run(t, nil, "create", "rolebinding", "alice-etcdbackup-viewer", "-n", ns,
		"--clusterrole=etcdbackup-viewer", "--user=alice@example.com"), "kubectl create rolebinding")
	r = mustSucceed(t, c.run(t, nil, "auth", "can-i", "create", "pods", "--subresource=portforward", "-n", ns, "--as", "alice@example.com"), "kubectl auth can-i")
	if strings.TrimSpace(r.Stdout) != "yes" {
		t.Errorf("alice may not port-forward to the server: %s", r)
	}
	r = c.run(t, nil, "auth", "can-i", "delete", "backups.etcdbackup.io", "-n", ns, "--as", "alice@example.com")
	if strings.TrimSpace(r.Stdout) != "no" {
		t.Errorf("a viewer may delete backups: %s", r)
	}
}

// refTag is the tag of an image reference.
func refTag(ref string) string {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return "latest"
}

// copyFiles copies each source to its path under dir, private to the
// user, as the doc's commands leave them.
func copyFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for to, from := range files {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, to)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// edit replaces old by new in path, failing unless old appears n times:
// the example and this test (and the doc) change together.
func edit(t *testing.T, path string, n int, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(b), old); got != n {
		t.Fatalf("%s: %q appears %d times, want %d: update docs/install.md and this test with the example", path, old, got, n)
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(b), old, new)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// cutFrom removes path's text from start up to (not including) end.
func cutFrom(t *testing.T, path, start, end string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q before %q", path, start, end)
	}
	if err := os.WriteFile(path, []byte(s[:i]+s[j:]), 0o600); err != nil {
		t.Fatal(err)
	}
}
