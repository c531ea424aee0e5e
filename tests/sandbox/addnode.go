package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// AddNode starts a second node, Node2Name at Node2IP with pods from
// Node2PodCIDR, joined like the first: its own network namespace on the
// switch, mount namespace, containerd (with every image archive imported so
// far, and TagImage's names), kubelet (its own identity and cgroupRoot),
// kube-proxy and, with Config.NetworkPolicy, kube-network-policies. Its
// volumesRoot is node 0's directory, so a hostPath volume (the default
// StorageClass', ReadWriteMany too) is the same on both nodes. It returns
// the node's name once the Node is Ready; Stop stops it with the rest. The
// cluster's own pods (CoreDNS) stay on node 0. It is called at most once;
// ImportImages and TagImage wait while it runs.
func (s *Sandbox) AddNode(ctx context.Context) (string, error) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	s.cpMu.Lock()
	stopped := s.stopped
	s.cpMu.Unlock()
	if stopped {
		return "", errors.New("sandbox: AddNode: the sandbox is stopped")
	}
	if s.node2 != nil {
		return "", fmt.Errorf("sandbox: AddNode: node %s runs already", Node2Name)
	}
	began := time.Now()
	sp := nodeSpecs[1]
	n := &node{spec: sp, root: filepath.Join(s.dir, "node"+sp.suffix)}
	var err error
	if n.serving, n.client, err = s.pki.nodeCerts(sp); err != nil {
		return "", fmt.Errorf("sandbox: AddNode: certificates: %w", err)
	}
	if err := setupNodeNetwork(ctx, sp); err != nil {
		return "", fmt.Errorf("sandbox: AddNode: %w", err)
	}
	if err := createCgroup(sp.cgroupRoot); err != nil {
		return "", fmt.Errorf("sandbox: AddNode: %w", err)
	}
	volumes := s.node.hostPath(volumesRoot)
	if err := os.MkdirAll(volumes, 0o755); err != nil {
		return "", fmt.Errorf("sandbox: AddNode: %w", err)
	}
	// Stop (or cleanupNode after a crash) undoes a half-started node: its
	// processes, namespaces and cgroups are the sandbox's.
	s.node2 = n
	if err := s.bootNode(ctx, n, volumes, s.archives, s.networkPolicy); err != nil {
		return "", fmt.Errorf("sandbox: AddNode: %w", err)
	}
	for _, t := range s.tags {
		if err := n.tag(ctx, t[0], t[1]); err != nil {
			return "", err
		}
	}
	s.logf("node %s added in %s", sp.name, since(began))
	return sp.name, nil
}

// createCgroup creates cgroup name (a path from the root) in every
// hierarchy: the kubelet refuses a cgroupRoot missing from any. In cpuset
// it gets its parent's CPUs and memory nodes (a v1 cpuset starts with none,
// and no process could join it or its children).
func createCgroup(name string) error {
	hierarchies, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		base := filepath.Join("/sys/fs/cgroup", h.Name())
		if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
			continue
		}
		d := filepath.Join(base, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(filepath.Dir(d), f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if cur, _ := os.ReadFile(filepath.Join(d, f)); strings.TrimSpace(string(cur)) != "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %s: %w", d, f, err)
			}
		}
	}
	return nil
}
