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

// startNode brings up node 0 (Start): its namespaces, containerd with the
// images imported, the kubelet, kube-proxy and, if netpol,
// kube-network-policies; it returns once the Node is Ready and
// NetworkPolicy is enforced.
func (s *Sandbox) startNode(ctx context.Context, images []string, netpol bool) error {
	n := &node{spec: nodeSpecs[0], root: filepath.Join(s.dir, "node"), serving: s.pki.node, client: s.pki.nodeClient}
	s.node = n
	return s.bootNode(ctx, n, "", images, netpol)
}

// bootNode starts node n, whose network namespace exists, as startNode
// says; volumes is the host directory its volumesRoot shows ("": its own).
func (s *Sandbox) bootNode(ctx context.Context, n *node, volumes string, images []string, netpol bool) error {
	if err := n.writeCNI(s.nodeDir); err != nil {
		return err
	}
	var err error
	if n.holder, n.holderDone, err = startHolder(ctx, n.spec.netns, n.root, volumes); err != nil {
		return err
	}
	cfg, err := s.writeNodeConfig(n)
	if err != nil {
		return err
	}

	step := time.Now()
	if n.containerd, err = s.launchInNode(n, "containerd", "containerd", "--config", cfg.containerd); err != nil {
		return err
	}
	if err := n.waitContainerd(ctx); err != nil {
		return err
	}
	s.logf("%s: containerd ready (%s)", n.spec.name, since(step))

	// The images load while the kubelet registers the node.
	step = time.Now()
	importDone := make(chan error, 1)
	go func() { importDone <- s.importArchives(ctx, n, images) }()
	if n.kubelet, err = s.launchInNode(n, "kubelet", s.binPath("kubelet"),
		"--config="+cfg.kubelet,
		"--kubeconfig="+cfg.kubeletKubeconfig,
		"--hostname-override="+n.spec.name,
		"--node-ip="+n.spec.ip,
		"--v=1",
	); err != nil {
		<-importDone
		return err
	}
	if n.kubeProxy, err = s.launchInNode(n, "kube-proxy", s.binPath("kube-proxy"),
		"--config="+cfg.kubeProxy, "--v=1"); err != nil {
		<-importDone
		return err
	}
	if err := <-importDone; err != nil {
		return err
	}
	if err := s.waitNodeReady(ctx, n); err != nil {
		return err
	}
	s.logf("node %s Ready: kubelet, kube-proxy (nftables), %d image archives imported (%s)", n.spec.name, len(images), since(step))
	if netpol {
		step = time.Now()
		if err := s.startNetworkPolicy(ctx, n); err != nil {
			return err
		}
		s.logf("kube-network-policies enforcing NetworkPolicy on node %s (%s)", n.spec.name, since(step))
	}
	return nil
}

// writeCNI gives the node its CNI plugins and conflist.
func (n *node) writeCNI(nodeDir string) error {
	for _, d := range []string{"opt/cni/bin", "opt/cni/net.d"} {
		if err := os.MkdirAll(filepath.Join(n.root, d), 0o755); err != nil {
			return err
		}
	}
	for _, p := range cniPlugins {
		if err := copyFile(filepath.Join(nodeDir, "cni", "bin", p), filepath.Join(n.root, "opt/cni/bin", p), 0o755); err != nil {
			return fmt.Errorf("CNI plugin: %w", err)
		}
	}
	return os.WriteFile(filepath.Join(n.root, "opt/cni/net.d/10-sandbox.conflist"), []byte(cniConfig(n.spec.podCIDR)), 0o644)
}

// nodeConfig are the paths of a node's configuration files.
type nodeConfig struct {
	containerd, kubelet, kubeProxy, kubeletKubeconfig string
}

// writeNodeConfig writes the node's daemons' configurations and
// kubeconfigs: the kubelet's with the node's own identity (NodeRestriction
// lets a kubelet touch only its own Node and pods), kube-proxy's shared.
func (s *Sandbox) writeNodeConfig(n *node) (nodeConfig, error) {
	dir := filepath.Join(s.dir, "node"+n.spec.suffix+"-config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nodeConfig{}, err
	}
	cfg := nodeConfig{
		containerd: filepath.Join(dir, "containerd.toml"),
		kubelet:    filepath.Join(dir, "kubelet.yaml"),
		kubeProxy:  filepath.Join(dir, "kube-proxy.yaml"),
	}
	files := map[string]string{
		cfg.containerd: containerdConfig(s.pauseImage),
		cfg.kubelet:    kubeletConfig(s.pki.clientCA.certFile, n.serving.certFile, n.serving.keyFile, "", n.spec),
		cfg.kubeProxy:  kubeProxyConfig(filepath.Join(s.dir, "kubeconfigs", "kube-proxy.kubeconfig"), n.spec),
	}
	for name, content := range files {
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			return nodeConfig{}, err
		}
	}
	var err error
	if cfg.kubeletKubeconfig, err = s.componentKubeconfig("kubelet"+n.spec.suffix, n.client); err != nil {
		return nodeConfig{}, err
	}
	if _, err := s.componentKubeconfig("kube-proxy", s.pki.kubeProxy); err != nil {
		return nodeConfig{}, err
	}
	return cfg, nil
}

// launchInNode starts a daemon inside node n's namespaces, its output in
// NAME.log (node 0) or NAME-2.log (node 2) in the sandbox dir.
func (s *Sandbox) launchInNode(n *node, name, binary string, args ...string) (*process, error) {
	argv := n.inNode(append([]string{binary}, args...)...)
	p, err := launch(name+n.spec.suffix, argv[0], s.dir, argv[1:])
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

// importArchives imports OCI image archives into node n's containerd, as
// an air-gapped node is loaded: `ctr images import`, only this machine's
// platform (the archives may carry more). Each image is also named by its
// digest (NAME@sha256:…), as a pulled image is, so the kubelet reports the
// digest in container statuses (imageID).
func (s *Sandbox) importArchives(ctx context.Context, n *node, archives []string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(archives))
	for i, a := range archives {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = importArchive(ctx, n, a)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func importArchive(ctx context.Context, n *node, archive string) error {
	refs, err := ociimage.ReadDigests(archive)
	if err != nil {
		return fmt.Errorf("image archive %s: %w", archive, err)
	}
	if err := n.ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("import image archive %s: %w", archive, err)
	}
	for ref, digest := range refs {
		name := ref
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
			name = ref[:i]
		}
		if err := n.ctr(ctx, "images", "tag", "--force", ref, name+"@"+digest); err != nil {
			return fmt.Errorf("name image %s by its digest: %w", ref, err)
		}
	}
	return nil
}

// ImportImages imports OCI image archives into every running node's
// containerd, and into a node AddNode starts later; Pods with
// imagePullPolicy IfNotPresent or Never then run them.
func (s *Sandbox) ImportImages(ctx context.Context, archives ...string) error {
	s.nodesMu.Lock()
	s.archives = append(s.archives, archives...)
	nodes := s.nodes()
	s.nodesMu.Unlock()
	for _, n := range nodes {
		if err := s.importArchives(ctx, n, archives); err != nil {
			return fmt.Errorf("sandbox: node %s: %w", n.spec.name, err)
		}
	}
	return nil
}

// nodes are the running nodes, node 0 first; the caller holds nodesMu.
func (s *Sandbox) nodes() []*node {
	var ns []*node
	for _, n := range []*node{s.node, s.node2} {
		if n != nil {
			ns = append(ns, n)
		}
	}
	return ns
}

// allNodes is nodes for callers that do not hold nodesMu.
func (s *Sandbox) allNodes() []*node {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	return s.nodes()
}

// waitNodeReady waits until node n's kubelet has registered its Node and
// reports it Ready (the runtime and the CNI network are up).
func (s *Sandbox) waitNodeReady(ctx context.Context, n *node) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return poll(ctx, "node "+n.spec.name+" to be Ready", func() (bool, string, error) {
		for _, p := range n.daemons() {
			select {
			case <-p.exited:
				return false, "", fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.logTail(20))
			default:
			}
		}
		node, err := s.client.CoreV1().Nodes().Get(ctx, n.spec.name, metav1.GetOptions{})
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

// stopNodes kills the nodes hard: their daemons, then every process left
// in their network namespaces (containerd's shims) and in their cgroups
// (the containers). A node's mounts go with its mount namespace, whose last
// process this kills. A graceful pod shutdown is pointless here: the
// cluster's state is thrown away with it. The cgroups, the network
// namespaces and the link go last (cleanupNode), once the API server,
// which listens on the link, has stopped.
func (s *Sandbox) stopNodes() error {
	nodes := s.allNodes()
	var errs []error
	// kube-network-policies (fail-closed) too: its nftables table goes
	// with the network namespace, in cleanupNode.
	for _, n := range nodes {
		for _, p := range n.daemons() {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	if err := killNetnsProcs(); err != nil {
		errs = append(errs, err)
	}
	for _, n := range nodes {
		if n.holder != nil {
			_ = n.holder.Process.Kill()
			<-n.holderDone
		}
	}
	if err := killCgroupProcs(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killNetnsProcs SIGKILLs every process in the nodes' and the switch's
// network namespaces (containerd's shims, the namespace holders) until
// none is left.
func killNetnsProcs() error {
	var want []syscall.Stat_t
	for _, ns := range netnsNames() {
		var st syscall.Stat_t
		if err := syscall.Stat("/run/netns/"+ns, &st); err == nil {
			want = append(want, st)
		}
	}
	if len(want) == 0 {
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
			if err := syscall.Stat("/proc/"+e.Name()+"/ns/net", &st); err != nil {
				continue
			}
			for _, w := range want {
				if st.Ino == w.Ino && st.Dev == w.Dev {
					pids = append(pids, pid)
				}
			}
		}
		return pids
	}, "the nodes' network namespaces")
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
