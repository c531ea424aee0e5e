package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/kitagent"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/kit"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// etcdManifest is kubeadm's static etcd pod, as it writes it for member
// name with peer URL peer.
func etcdManifest(name, peer string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: etcd
  namespace: kube-system
spec:
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.6.5-0
    command:
    - etcd
    - --advertise-client-urls=https://10.0.0.10:2379
    - --data-dir=/var/lib/etcd
    - --initial-advertise-peer-urls=%[2]s
    - --initial-cluster=%[1]s=%[2]s
    - --name=%[1]s
    volumeMounts:
    - mountPath: /var/lib/etcd
      name: etcd-data
    - mountPath: /etc/kubernetes/pki/etcd
      name: etcd-certs
  hostNetwork: true
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki/etcd
      type: DirectoryOrCreate
    name: etcd-certs
  - hostPath:
      path: /var/lib/etcd
      type: DirectoryOrCreate
    name: etcd-data
`, name, peer)
}

// controlPlaneNode is a kubeadm node's /etc/kubernetes under a directory
// standing for its root.
func controlPlaneNode(t *testing.T, peer string) (root string, files map[string]string) {
	t.Helper()
	root = t.TempDir()
	files = map[string]string{
		"/etc/kubernetes/pki/ca.key":                    "cluster CA key",
		"/etc/kubernetes/pki/sa.key":                    "service-account signing key",
		"/etc/kubernetes/pki/etcd/ca.key":               "etcd CA key",
		"/etc/kubernetes/admin.conf":                    "admin kubeconfig",
		"/etc/kubernetes/enc/encryption-config.yaml":    "kind: EncryptionConfiguration",
		"/etc/kubernetes/manifests/etcd.yaml":           etcdManifest("cp-1", peer),
		"/etc/kubernetes/manifests/kube-apiserver.yaml": "kind: Pod",
	}
	for p, body := range files {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root, files
}

// The node is gone: from the backup and its kit alone, --rebuild puts
// back the kit's files (moving aside what is there), the etcd member
// with the revision bump, and the static-pod manifests last.
func TestRebuildBringsBackAControlPlaneNode(t *testing.T) {
	ctx := context.Background()
	key, other := agetest.NewKey(t), agetest.NewKey(t)
	peer := freeURL(t)
	host, files := controlPlaneNode(t, peer.String())
	snap := etcdSnapshot(t, map[string]string{"/registry/secrets/default/s": "v", "/registry/pods/default/p": "w"})
	st, err := snapshot.Check(snap)
	if err != nil {
		t.Fatal(err)
	}
	cp := config.Target{Name: "cp", Endpoints: []string{"https://10.0.0.10:2379"}, Kit: &config.Kit{NodeName: "cp-1", AgeRecipients: []string{key.Recipient}}}
	srv := servertest.StartWith(t, servertest.Options{Targets: []config.Target{cp}, AgentGuard: servertest.AsAgent{
		Kind: agentjob.Kit, JobNamespace: "etcdbackup-restore", JobName: "kit-b1", Backup: "b1", Location: "default", Target: "cp", Node: "cp-1",
	}})
	addr := "--server-address=" + srv.Addr
	mustRun(t, addr, "upload", snap, "--name", "b1")
	if _, err := kitagent.Run(ctx, srv.AgentClient, kitagent.Options{Name: "b1", Location: "default", Target: "cp", Paths: []string{"/etc/kubernetes"},
		HostRoot: host, Recipients: []string{key.Recipient}, Node: "cp-1", KubeVersion: "v1.37.2"}); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, addr, "list", "-o", "wide").out; !strings.Contains(out, "KIT") || !strings.Contains(out, "12 entries") {
		t.Errorf("list -o wide shows no kit:\n%s", out)
	}
	if out := mustRun(t, addr, "describe", "b1").out; !strings.Contains(out, "Recovery Kit:") || !strings.Contains(out, key.Recipient) ||
		!strings.Contains(out, "/etc/kubernetes/pki/ca.key") || !strings.Contains(out, "Kubernetes v1.37.2") {
		t.Errorf("describe shows no kit:\n%s", out)
	}
	if out := mustRun(t, addr, "verify", "b1", "--identity", key.File).out; !strings.Contains(out, `recovery kit "b1.kit": opened here: 12 entries`) {
		t.Errorf("verify --identity:\n%s", out)
	}

	// The empty node: only a file someone put there since, kept aside.
	root := t.TempDir()
	newer := filepath.Join(root, "etc/kubernetes/pki/ca.key")
	if err := os.MkdirAll(filepath.Dir(newer), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newer, []byte("a newer CA key"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{addr, "restore", "b1", "--local", "--rebuild", "--root", root, "--identity", key.File}
	unchanged := func(when string) {
		t.Helper()
		entries, _ := os.ReadDir(root)
		if b, _ := os.ReadFile(newer); len(entries) != 1 || string(b) != "a newer CA key" {
			t.Fatalf("%s changed the node: %d entries at its root, ca.key %q", when, len(entries), b)
		}
	}

	r := run(t, append(args[:len(args)-2], "--identity", other.File, "--ignore-version-skew")...)
	if ExitCode(r.err) != ExitRefused || !strings.Contains(r.err.Error(), "none of the identities given opens the recovery kit") || !strings.Contains(r.err.Error(), key.Recipient) {
		t.Fatalf("another identity: %v (exit %d), want a refusal naming the kit's recipient", r.err, ExitCode(r.err))
	}
	unchanged("a wrong identity")
	r = run(t, append(args, "--kubelet", filepath.Join(t.TempDir(), "kubelet"))...)
	if ExitCode(r.err) != ExitRefused || !strings.Contains(r.err.Error(), "install kubelet v1.37.2") || !strings.Contains(r.err.Error(), "nothing was changed") {
		t.Fatalf("no kubelet: %v (exit %d)", r.err, ExitCode(r.err))
	}
	unchanged("a node without kubelet")

	args = append(args, "--ignore-version-skew")
	dry := mustRun(t, append(args, "--dry-run")...).out
	for _, want := range []string{
		"would write " + newer + " (-rw-------, 14 bytes), moving what is there to " + filepath.Join(root, "etc/kubernetes/pki/.ca.key.before-rebuild-"),
		fmt.Sprintf("would restore backup %q into %s for etcd member %q", "b1", filepath.Join(root, "var/lib/etcd"), "cp-1"),
		"would write, last " + filepath.Join(root, "etc/kubernetes/manifests/etcd.yaml"),
	} {
		if !strings.Contains(dry, want) {
			t.Errorf("--dry-run does not say %q:\n%s", want, dry)
		}
	}
	if strings.Index(dry, "manifests/etcd.yaml") < strings.Index(dry, "would restore backup") {
		t.Errorf("--dry-run writes the manifests before etcd's data:\n%s", dry)
	}
	unchanged("--dry-run")
	if strings.Contains(dry, "restored in") {
		t.Errorf("--dry-run prints an elapsed time:\n%s", dry)
	}

	// Read at the start, when the kit's files are written, at the
	// download's last byte, the checks' end and the rebuild's end.
	r = runRestoreAt(t, []time.Duration{0, 3 * time.Second, 44 * time.Second, 50 * time.Second, 86 * time.Second}, args...)
	if r.err != nil {
		t.Fatalf("rebuild: %v\n%s", r.err, r.errOut)
	}
	if !strings.Contains(r.out, `node rebuilt from "b1" in 1m26s: `) || !strings.HasSuffix(r.out, "\nrestored in 1m26s: kit 3s, download 41s, verify 6s, rebuild 36s\n") {
		t.Errorf("rebuild stdout:\n%s", r.out)
	}
	for p, body := range files {
		f := filepath.Join(root, p)
		b, err := os.ReadFile(f)
		fi, _ := os.Stat(f)
		if err != nil || string(b) != body || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s after the rebuild: %q %v (mode %v)", p, b, err, fi.Mode())
		}
	}
	aside, _ := filepath.Glob(filepath.Join(root, "etc/kubernetes/pki/.ca.key.before-rebuild-*"))
	if len(aside) != 1 {
		t.Fatalf("the newer ca.key was not kept aside: %v", aside)
	}
	if b, _ := os.ReadFile(aside[0]); string(b) != "a newer CA key" {
		t.Errorf("kept aside: %q", b)
	}
	c := startEtcd(t, filepath.Join(root, "var/lib/etcd"), "cp-1", peer)
	resp, err := c.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 2 || resp.Header.Revision != st.Revision+snapshot.DefaultRevisionBump {
		t.Errorf("the rebuilt member holds %d keys at revision %d, want 2 at %d", len(resp.Kvs), resp.Header.Revision, st.Revision+snapshot.DefaultRevisionBump)
	}
}

// The kubelet on the node must be of the kit's Kubernetes minor version;
// checked with a real kubelet (make node-bins), skipped without one.
func TestRebuildChecksTheKubeletsVersion(t *testing.T) {
	dir := os.Getenv("ETCDBACKUP_KUBE_BIN_DIR")
	if dir == "" {
		dir = filepath.Join("..", ".cache", "kube", "bin")
	}
	kubelet := filepath.Join(dir, "kubelet")
	if _, err := os.Stat(kubelet); err != nil {
		t.Skipf("no kubelet at %s (make node-bins builds it)", kubelet)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A kit recorded for another Kubernetes version, against a real
	// kubelet: the whole command refuses and changes nothing.
	key := agetest.NewKey(t)
	peer := freeURL(t)
	host, _ := controlPlaneNode(t, peer.String())
	cp := config.Target{Name: "cp", Endpoints: []string{"https://10.0.0.10:2379"}, Kit: &config.Kit{NodeName: "cp-1", AgeRecipients: []string{key.Recipient}}}
	srv := servertest.StartWith(t, servertest.Options{Targets: []config.Target{cp}, AgentGuard: servertest.AsAgent{
		Kind: agentjob.Kit, JobNamespace: "etcdbackup-restore", JobName: "kit-old", Backup: "old", Location: "default", Target: "cp", Node: "cp-1",
	}})
	addr := "--server-address=" + srv.Addr
	mustRun(t, addr, "upload", etcdSnapshot(t, map[string]string{"k": "v"}), "--name", "old")
	if _, err := kitagent.Run(ctx, srv.AgentClient, kitagent.Options{Name: "old", Location: "default", Target: "cp", Paths: []string{"/etc/kubernetes"},
		HostRoot: host, Recipients: []string{key.Recipient}, Node: "cp-1", KubeVersion: "v1.36.4"}); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	r := run(t, addr, "restore", "old", "--local", "--rebuild", "--root", root, "--identity", key.File, "--kubelet", kubelet)
	if ExitCode(r.err) != ExitRefused || !strings.Contains(r.err.Error(), "the kit was taken with Kubernetes v1.36.4 but this node's kubelet is v1.37.2: install kubelet (and kubeadm, kubectl) 1.36.x first") ||
		!strings.Contains(r.err.Error(), "nothing was changed") {
		t.Errorf("a kit of another version: %v (exit %d)", r.err, ExitCode(r.err))
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("the refused rebuild wrote %d entries", len(entries))
	}

	o := &RestoreOptions{Rebuild: RebuildOptions{Kubelet: kubelet}}
	if skew := o.checkVersions(ctx, kit.Versions{Kubernetes: "v1.37.2"}); len(skew) != 0 {
		t.Errorf("the kit's own version: %v", skew)
	}
	if skew := o.checkVersions(ctx, kit.Versions{Kubernetes: "v1.36.4"}); len(skew) != 1 || !strings.Contains(skew[0], "the kit was taken with Kubernetes v1.36.4 but this node's kubelet is v1.37.2") {
		t.Errorf("another minor version: %v", skew)
	}
	if skew := o.checkVersions(ctx, kit.Versions{Etcd: "3.5.21", Kubernetes: "v1.37.0"}); len(skew) != 1 || !strings.Contains(skew[0], "etcd 3.5.21") {
		t.Errorf("a backup of etcd 3.5: %v", skew)
	}
}
