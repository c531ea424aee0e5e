package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ociimage"
)

// nodePATH is the PATH of the node's daemons: containerd finds runc and
// its shim there, the kubelet mount.
const nodePATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// cniPlugins are the CNI plugin binaries the node needs (in the node dir's
// cni/bin): the conflist's and loopback, which containerd calls for every
// pod's lo.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// startNode brings up the node: its namespaces, containerd with the images
// imported, the kubelet, kube-proxy and, if netpol, kube-network-policies;
// it returns once the Node is Ready and NetworkPolicy is enforced.
func (s *Sandbox) startNode(ctx context.Context, images []string, netpol bool) error {
	n := &node{root: filepath.Join(s.dir, "node")}
	s.node = n
	for _, d := range []string{"opt/cni/bin", "opt/cni/net.d"} {
		if err := os.MkdirAll(filepath.Join(n.root, d), 0o755); err != nil {
			return err
		}
	}
	for _, p := range cniPlugins {
		if err := copyFile(filepath.Join(s.nodeDir, "cni", "bin", p), filepath.Join(n.root, "opt/cni/bin", p), 0o755); err != nil {
			return fmt.Errorf("CNI plugin: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(n.root, "opt/cni/net.d/10-sandbox.conflist"), []byte(cniConfig()), 0o644); err != nil {
		return err
	}
	var err error
	if n.holder, n.holderDone, err = startHolder(ctx, n.root); err != nil {
		return err
	}

	cfgDir := filepath.Join(s.dir, "node-config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"containerd.toml": containerdConfig(s.pauseImage),
		"kubelet.yaml":    kubeletConfig(s.pki.clientCA.certFile, s.pki.node.certFile, s.pki.node.keyFile, ""),
		"kube-proxy.yaml": kubeProxyConfig(filepath.Join(s.dir, "kubeconfigs", "kube-proxy.kubeconfig")),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(cfgDir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	kubeletKubeconfig, err := s.componentKubeconfig("kubelet", s.pki.nodeClient)
	if err != nil {
		return err
	}
	if _, err := s.componentKubeconfig("kube-proxy", s.pki.kubeProxy); err != nil {
		return err
	}

	step := time.Now()
	if n.containerd, err = s.launchInNode("containerd", "containerd", "--config", filepath.Join(cfgDir, "containerd.toml")); err != nil {
		return err
	}
	if err := n.waitContainerd(ctx); err != nil {
		return err
	}
	s.logf("containerd ready (%s)", since(step))

	// The images load while the kubelet registers the node.
	step = time.Now()
	importDone := make(chan error, 1)
	go func() { importDone <- s.importArchives(ctx, images) }()
	if n.kubelet, err = s.launchInNode("kubelet", s.binPath("kubelet"),
		"--config="+filepath.Join(cfgDir, "kubelet.yaml"),
		"--kubeconfig="+kubeletKubeconfig,
		"--hostname-override="+NodeName,
		"--node-ip="+NodeIP,
		"--v=1",
	); err != nil {
		<-importDone
		return err
	}
	if n.kubeProxy, err = s.launchInNode("kube-proxy", s.binPath("kube-proxy"),
		"--config="+filepath.Join(cfgDir, "kube-proxy.yaml"), "--v=1"); err != nil {
		<-importDone
		return err
	}
	if err := <-importDone; err != nil {
		return err
	}
	if err := s.waitNodeReady(ctx); err != nil {
		return err
	}
	s.logf("node %s Ready: kubelet, kube-proxy (nftables), %d image archives imported (%s)", NodeName, len(images), since(step))
	if netpol {
		step = time.Now()
		if err := s.startNetworkPolicy(ctx); err != nil {
			return err
		}
		s.logf("kube-network-policies enforcing NetworkPolicy on the node (%s)", since(step))
	}
	return nil
}

// nodeProcess is one of the node's daemons by name, nil if not started.
func (s *Sandbox) nodeProcess(name string) *process {
	if s.node == nil {
		return nil
	}
	for _, p := range s.node.daemons() {
		if p.name == name {
			return p
		}
	}
	return nil
}

// launchInNode starts a daemon inside the node's namespaces, its output in
// NAME.log in the sandbox dir.
func (s *Sandbox) launchInNode(name, binary string, args ...string) (*process, error) {
	argv := s.node.inNode(append([]string{binary}, args...)...)
	p, err := launch(name, argv[0], s.dir, argv[1:])
	if err != nil {
		return nil, err
	}
	return p, nil
}

// waitContainerd waits until containerd answers on its socket.
func (n *node) waitContainerd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		select {
		case <-n.containerd.exited:
			return fmt.Errorf("containerd exited (%v); last lines of %s:\n%s", n.containerd.waitErr, n.containerd.logPath, n.containerd.logTail(20))
		default:
		}
		if _, err := os.Stat(n.sockPath()); err == nil {
			if last = n.ctr(ctx, "version"); last == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd not answering on %s (%v): %w", n.sockPath(), last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ctr runs containerd's own client against the node's containerd in the
// namespace the CRI uses.
func (n *node) ctr(ctx context.Context, args ...string) error {
	return run(ctx, append([]string{"ctr", "--address", n.sockPath(), "--namespace", "k8s.io"}, args...)...)
}

// importArchives imports OCI image archives into the node's containerd, as
// an air-gapped node is loaded: `ctr images import`, only this machine's
// platform (the archives may carry more). Each image is also named by its
// digest (NAME@sha256:…), as a pulled image is, so the kubelet reports the
// digest in container statuses (imageID).
func (s *Sandbox) importArchives(ctx context.Context, archives []string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(archives))
	for i, a := range archives {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.importArchive(ctx, a)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s *Sandbox) importArchive(ctx context.Context, archive string) error {
	refs, err := ociimage.ReadDigests(archive)
	if err != nil {
		return fmt.Errorf("image archive %s: %w", archive, err)
	}
	if err := s.node.ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("import image archive %s: %w", archive, err)
	}
	for ref, digest := range refs {
		name := ref
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
			name = ref[:i]
		}
		if err := s.node.ctr(ctx, "images", "tag", "--force", ref, name+"@"+digest); err != nil {
			return fmt.Errorf("name image %s by its digest: %w", ref, err)
		}
	}
	return nil
}

// ImportImages imports OCI image archives into the node's containerd; Pods
// with imagePullPolicy IfNotPresent or Never then run them.
func (s *Sandbox) ImportImages(ctx context.Context, archives ...string) error {
	if err := s.importArchives(ctx, archives); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	return nil
}

// waitNodeReady waits until the kubelet has registered the Node and
// reports it Ready (the runtime and the CNI network are up).
func (s *Sandbox) waitNodeReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return poll(ctx, "node "+NodeName+" to be Ready", func() (bool, string, error) {
		for _, p := range s.node.daemons() {
			select {
			case <-p.exited:
				return false, "", fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.logTail(20))
			default:
			}
		}
		node, err := s.client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not registered", nil
		}
		if err != nil {
			return false, "", fmt.Errorf("get node: %w", err)
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message, nil
			}
		}
		return false, "no Ready condition", nil
	})
}

// stopNode kills the node hard: its daemons, then every process left in
// its network namespace (containerd's shims) and in its cgroups (the
// containers). The node's mounts go with its mount namespace, whose last
// process this kills. A graceful pod shutdown is pointless here: the
// cluster's state is thrown away with it. The cgroups, the network
// namespace and the link go last (cleanupNode), once the API server, which
// listens on the link, has stopped.
func (s *Sandbox) stopNode() error {
	n := s.node
	var errs []error
	// kube-network-policies (fail-closed) too: its nftables table goes
	// with the network namespace, in cleanupNode.
	for _, p := range n.daemons() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	if err := killNetnsProcs(); err != nil {
		errs = append(errs, err)
	}
	if n.holder != nil {
		_ = n.holder.Process.Kill()
		<-n.holderDone
	}
	if err := killCgroupProcs(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killNetnsProcs SIGKILLs every process in the node's network namespace
// (containerd's shims, the namespace holder) until none is left.
func killNetnsProcs() error {
	var want syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+netnsName, &want); err != nil {
		return nil // no namespace, no process in it
	}
	return killAll(func() []int {
		var pids []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid := 0
			if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
				continue
			}
			var st syscall.Stat_t
			if err := syscall.Stat("/proc/"+e.Name()+"/ns/net", &st); err == nil && st.Ino == want.Ino && st.Dev == want.Dev {
				pids = append(pids, pid)
			}
		}
		return pids
	}, "the node's network namespace")
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
