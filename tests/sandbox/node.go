package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// NodeName is the name of the sandbox's first Node, the one Start brings up.
const NodeName = "sandbox-node"

// Node2Name, Node2IP and Node2PodCIDR are the second Node's, which AddNode
// brings up on demand.
const (
	Node2Name    = "sandbox-node-2"
	Node2IP      = "172.30.0.3"
	Node2PodCIDR = "10.244.1.0/24"
)

// The network: a "switch" network namespace holding a bridge, to which the
// host and every node are joined by a veth pair each, as kind nodes are
// joined to their Docker network. Nodes reach each other at L2, so the host
// never routes between them (its ip_forward stays as it is). The host side
// carries the address the API server and the host services (etcd, S3)
// listen on; each node's side is its Node's InternalIP. Pods get addresses
// from their node's PodCIDR on the node's bridge; Services get ClusterIPs
// from ServiceCIDR, which only kube-proxy's rules inside the nodes know.
// None of these is an address of the machine's own network.
const (
	netnsName    = "etcdbackup-node" // node 0's network namespace
	switchNetns  = "etcdbackup-net"
	switchBridge = "br0"
	hostLink     = "etcdbackup0"
	hostPort     = "host" // the host link's end on the switch
	nodeLink     = "eth0"
	HostIP       = "172.30.0.1" // host end of its veth
	NodeIP       = "172.30.0.2" // node 0's end: the Node's InternalIP
	nodeNetPrefx = "/24"
	PodCIDR      = "10.244.0.0/24" // node 0's pods
	// ClusterCIDR is the cluster's pod range (kube-proxy tells pod traffic
	// from other traffic by it); each node's PodCIDR is part of it.
	ClusterCIDR = "10.244.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
	// kubernetesServiceIP is the first address of ServiceCIDR: the
	// `kubernetes` Service, which in-cluster clients dial.
	kubernetesServiceIP = "10.96.0.1"
	// DNSServiceIP is the kube-dns Service's ClusterIP, the pods' resolver.
	DNSServiceIP = "10.96.0.10"
	// cniBridge is the bridge the CNI plugin makes inside each node.
	cniBridge = "cni0"
	// masqTable is the nftables table (family ip) that masquerades, in each
	// node, its pods' traffic leaving the cluster's pod range.
	masqTable = "sandbox-masquerade"
)

// nodeSpec is what tells one node from another: its names, addresses and
// where its files are.
type nodeSpec struct {
	name    string // the Node's name
	netns   string // its network namespace
	ip      string // its InternalIP, on the switch
	podCIDR string // its pods' range, on its bridge
	port    string // its veth's end on the switch
	// cgroupRoot is the kubelet's cgroupRoot: "" for the hierarchies' root
	// (node 0, as before there were two), else a cgroup of its own so the
	// two kubelets' kubepods trees stay apart.
	cgroupRoot string
	// suffix tells its files in the sandbox dir from node 0's: the root
	// "node"+suffix, the configs "node"+suffix+"-config", "kubelet"+suffix+".log".
	suffix string
}

// nodeSpecs are the sandbox's nodes: node 0, which Start brings up, and
// the one AddNode does.
var nodeSpecs = []nodeSpec{
	{name: NodeName, netns: netnsName, ip: NodeIP, podCIDR: PodCIDR, port: "node0"},
	{name: Node2Name, netns: "etcdbackup-node-2", ip: Node2IP, podCIDR: Node2PodCIDR, port: "node2",
		cgroupRoot: "/" + Node2Name, suffix: "-2"},
}

// nodeSysctls are the machine-wide (not per network namespace) kernel
// settings the kubelet sets at start. Inside the node's mount namespace a
// plain file is bind-mounted over each, so the kubelet's writes land there
// and the host keeps its values.
var nodeSysctls = []string{
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
}

// nodeDirs are the directories the kubelet, containerd and the CNI plugins
// hard-code; the node's mount namespace has its own copy of each (a
// directory under the node root bind-mounted over it).
var nodeDirs = []string{"/run", "/var/lib", "/var/log", "/opt"}

// cgroupNames are the cgroups the nodes create at the root of each
// hierarchy: node 0's kubelet's pod tree, containerd's namespace, and the
// cgroupRoot of node 2's kubelet (its pod tree under it).
var cgroupNames = []string{"kubepods", "k8s.io", nodeSpecs[1].cgroupRoot[1:]}

// node is the running node: the process holding its mount namespace and the
// daemons started inside it.
type node struct {
	spec       nodeSpec
	root       string   // host directory under which the node's private dirs live
	serving    *keyPair // the kubelet's serving certificate
	client     *keyPair // the kubelet's client certificate: system:node:NAME
	holder     *exec.Cmd
	holderDone chan struct{}

	containerd *process
	kubelet    *process
	kubeProxy  *process
	netpol     *process // kube-network-policies; nil unless Config.NetworkPolicy
}

// daemons are the node's daemons that run (the holder aside), containerd
// last: the order Stop kills them in.
func (n *node) daemons() []*process {
	var ps []*process
	for _, p := range []*process{n.kubelet, n.kubeProxy, n.netpol, n.containerd} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// hostPath maps a path inside the node's mount namespace (a hostPath
// volume, a log file) to where it is on the host.
func (n *node) hostPath(p string) string {
	p = filepath.Clean(p)
	for _, d := range nodeDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return filepath.Join(n.root, strings.TrimPrefix(d, "/"), strings.TrimPrefix(p, d))
		}
	}
	return p
}

// sockPath is containerd's socket as the host sees it.
func (n *node) sockPath() string { return n.hostPath("/run/containerd/containerd.sock") }

// setupNetwork creates the switch, joins the host to it, and node 0.
func setupNetwork(ctx context.Context) error {
	cmds := [][]string{
		{"ip", "netns", "add", switchNetns},
		{"ip", "-n", switchNetns, "link", "add", switchBridge, "type", "bridge"},
		{"ip", "-n", switchNetns, "link", "set", switchBridge, "up"},
		{"ip", "link", "add", hostLink, "type", "veth", "peer", "name", hostPort, "netns", switchNetns},
		{"ip", "-n", switchNetns, "link", "set", hostPort, "master", switchBridge, "up"},
		{"ip", "addr", "add", HostIP + nodeNetPrefx, "dev", hostLink},
		{"ip", "link", "set", hostLink, "up"},
	}
	for _, c := range cmds {
		if err := run(ctx, c...); err != nil {
			return fmt.Errorf("network switch: %w", err)
		}
	}
	return setupNodeNetwork(ctx, nodeSpecs[0])
}

// setupNodeNetwork creates a node's network namespace, joins it to the
// switch, and routes the pod ranges: the host reaches each node's pods
// through that node, as a kind host does; a node reaches the other node's
// pods through it directly (not through the host, which does not forward)
// and everything else through the host. Its pods' traffic leaving the pod
// range is masqueraded to the node's IP, as kindnet does, so the host
// services answer it; traffic between pods keeps the pods' addresses, which
// NetworkPolicy selects on.
func setupNodeNetwork(ctx context.Context, sp nodeSpec) error {
	ns := sp.netns
	cmds := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", switchNetns, "link", "add", sp.port, "type", "veth", "peer", "name", nodeLink, "netns", ns},
		{"ip", "-n", switchNetns, "link", "set", sp.port, "master", switchBridge, "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "addr", "add", sp.ip + nodeNetPrefx, "dev", nodeLink},
		{"ip", "-n", ns, "link", "set", nodeLink, "up"},
		{"ip", "-n", ns, "route", "add", "default", "via", HostIP},
		{"ip", "route", "add", sp.podCIDR, "via", sp.ip, "dev", hostLink},
		// Per network namespace: the node routes its pods' traffic.
		{"ip", "netns", "exec", ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"},
		{"ip", "netns", "exec", ns, "nft", "add", "table", "ip", masqTable},
		{"ip", "netns", "exec", ns, "nft", "add", "chain", "ip", masqTable, "postrouting",
			"{ type nat hook postrouting priority srcnat; policy accept; }"},
		{"ip", "netns", "exec", ns, "nft", "add", "rule", "ip", masqTable, "postrouting",
			"ip", "saddr", sp.podCIDR, "ip", "daddr", "!=", ClusterCIDR, "masquerade"},
	}
	for _, other := range nodeSpecs {
		if other.name != sp.name {
			cmds = append(cmds, []string{"ip", "-n", ns, "route", "add", other.podCIDR, "via", other.ip, "dev", nodeLink})
		}
	}
	for _, c := range cmds {
		if err := run(ctx, c...); err != nil {
			return fmt.Errorf("node %s network: %w", sp.name, err)
		}
	}
	return nil
}

// LimitNodeEgress makes node 0's link to the switch carry at most rate
// (tc's notation: "800mbit") from the node to the host (and to node 2), as a network of
// that speed between a kubelet and its API server would: a token bucket
// (tc's tbf) on the node's end of the veth. What crosses it that way is
// the kubelet's side of every port-forward, so every download through the
// API server. The returned func lifts the limit; deleting the namespace
// at Stop does too. A benchmark uses it to compare paths where the
// network, not the machine's CPUs, limits them.
func (s *Sandbox) LimitNodeEgress(ctx context.Context, rate string) (lift func() error, err error) {
	// The bucket holds a few GSO super-packets (veth hands the qdisc up to
	// 64 KiB at once) and queues at most 20 ms, as a switch port would.
	if err := run(ctx, "ip", "netns", "exec", netnsName, "tc", "qdisc", "replace", "dev", nodeLink, "root",
		"tbf", "rate", rate, "burst", "512kb", "latency", "20ms"); err != nil {
		return nil, fmt.Errorf("limit the node's link to %s: %w", rate, err)
	}
	return func() error {
		if err := run(context.Background(), "ip", "netns", "exec", netnsName, "tc", "qdisc", "del", "dev", nodeLink, "root"); err != nil {
			return fmt.Errorf("lift the node link's limit: %w", err)
		}
		return nil
	}, nil
}

// teardownNetwork deletes the nodes' and the switch's network namespaces
// (the veth pairs and the routes go with them) and, if a crashed sandbox
// left it, the host link. The kernel destroys a namespace's devices
// asynchronously, after `ip netns delete` returns, so it waits until the
// host side of the veth is gone.
func teardownNetwork() error {
	var errs []error
	for _, ns := range netnsNames() {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			if err := run(context.Background(), "ip", "netns", "delete", ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if _, err := os.Stat("/sys/class/net/" + hostLink); errors.Is(err, os.ErrNotExist) {
			return true, nil
		}
		// Still there: a crashed sandbox's link, or one the kernel has not
		// reaped yet; deleting it from this side takes both ends. It may
		// vanish between the check and the delete, so its error is not
		// final.
		_ = run(ctx, "ip", "link", "delete", hostLink)
		return false, nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("host link %s still present: %w", hostLink, err))
	}
	return errors.Join(errs...)
}

// netnsNames are the network namespaces of the nodes and the switch.
func netnsNames() []string {
	names := []string{switchNetns}
	for _, sp := range nodeSpecs {
		names = append(names, sp.netns)
	}
	return names
}

// holderScript runs in the node's network namespace and a new private
// mount namespace. It keeps the cgroup mounts while giving the namespace a
// sysfs of its own network (what `ip netns exec` does, minus dropping
// /sys/fs/cgroup), gives the node private copies of the directories the
// kubelet and containerd hard-code, covers the machine-wide sysctls the
// kubelet writes with plain files, then prints "ready" and waits: the
// daemons join its namespaces with nsenter. With a second argument (node 2),
// that directory of the host becomes the node's volumesRoot: node 0's, so
// a hostPath volume is the same directory on every node, as a shared
// filesystem would make it (ReadWriteMany claims).
const holderScript = `set -eu
R=$1
V=${2:-}
mkdir -p "$R/.cgroup" "$R/.sysctl"
mount --rbind /sys/fs/cgroup "$R/.cgroup"
mount -t sysfs sysfs /sys
mount --rbind "$R/.cgroup" /sys/fs/cgroup
umount -l "$R/.cgroup"
for d in %s; do
	mkdir -p "$R/${d#/}"
	mount --bind "$R/${d#/}" "$d"
done
if [ -n "$V" ]; then
	mkdir -p %s
	mount --bind "$V" %s
fi
for s in %s; do
	f="$R/.sysctl/$(echo "$s" | tr / _)"
	cat "/proc/sys/$s" > "$f"
	mount --bind "$f" "/proc/sys/$s"
done
echo ready
exec sleep infinity
`

// startHolder starts the process that holds the node's mount namespace and
// returns once its mounts are in place; volumes, if not empty, is the host
// directory to mount on volumesRoot.
func startHolder(ctx context.Context, netns, root, volumes string) (*exec.Cmd, chan struct{}, error) {
	script := fmt.Sprintf(holderScript, strings.Join(nodeDirs, " "), volumesRoot, volumesRoot, strings.Join(nodeSysctls, " "))
	cmd := exec.Command("nsenter", "--net=/run/netns/"+netns, "--",
		"unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", script, "holder", root, volumes)
	cmd.SysProcAttr = childSysProcAttr()
	cmd.Env = []string{"PATH=" + nodePATH}
	cmd.Stderr = &tailBuffer{}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start node namespace holder: %w", err)
	}
	done := make(chan struct{})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("unexpected %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case err := <-ready:
		if err != nil {
			_ = cmd.Process.Kill()
			<-done
			return nil, nil, fmt.Errorf("node mount namespace: %v: %s", err, cmd.Stderr)
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return nil, nil, fmt.Errorf("node mount namespace: %w", ctx.Err())
	}
	return cmd, done, nil
}

// inNode is the command line that runs argv inside the node's namespaces.
func (n *node) inNode(argv ...string) []string {
	return append([]string{"nsenter", "-t", strconv.Itoa(n.holder.Process.Pid), "-m", "-n", "--"}, argv...)
}

// exec runs argv inside the node and returns its combined output.
func (n *node) exec(ctx context.Context, argv ...string) (string, error) {
	full := n.inNode(argv...)
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	cmd.Env = []string{"PATH=" + nodePATH}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// cleanupNode undoes everything a node leaves on the machine, whether it
// stopped or crashed, for every node: processes in their network
// namespaces and cgroups, their cgroups, the network namespaces and the
// host link. The nodes' mounts live only in their mount namespaces, which
// go with their last processes.
func cleanupNode() error {
	var errs []error
	// After a crash (the daemons die with the process that started them,
	// but containerd's shims and the containers do not).
	if err := killNetnsProcs(); err != nil {
		errs = append(errs, err)
	}
	if err := killCgroupProcs(); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := teardownNetwork(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// cgroupDirs are the node's cgroup directories in every hierarchy.
func cgroupDirs() []string {
	var dirs []string
	hierarchies, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range hierarchies {
		for _, name := range cgroupNames {
			d := filepath.Join("/sys/fs/cgroup", h.Name(), name)
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// cgroupPIDs lists every process in the node's cgroups.
func cgroupPIDs() []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range cgroupDirs() {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// killCgroupProcs SIGKILLs every process in the node's cgroups (the
// containers and the shims that joined them) until none is left.
func killCgroupProcs() error {
	return killAll(cgroupPIDs, "the node's cgroups")
}

// killAll SIGKILLs the processes list returns until it returns none, then
// waits (5 s at most) until they are dead: gone, or zombies (a killed
// container whose shim died too stays a zombie until init reaps it).
func killAll(list func() []int, where string) error {
	deadline := time.Now().Add(10 * time.Second)
	var killed []int
	defer func() { waitGone(killed, 5*time.Second) }()
	for {
		pids := list()
		if len(pids) == 0 {
			return nil
		}
		killed = append(killed, pids...)
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v in %s survive SIGKILL", pids, where)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitGone waits until none of pids runs any more, or timeout.
func waitGone(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Alive tells whether process pid exists and is not a zombie (dead, not
// yet reaped by its parent).
func Alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return true
	}
	f := strings.Fields(string(stat[i+1:]))
	return len(f) == 0 || (f[0] != "Z" && f[0] != "X")
}

// removeCgroups removes the node's cgroups, deepest first.
func removeCgroups() error {
	var errs []error
	for _, d := range cgroupDirs() {
		var all []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			var err error
			// A cgroup whose last process just died can be busy for a moment.
			for try := 0; try < 50; try++ {
				if err = syscall.Rmdir(all[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", all[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// run runs a command on the host (found on PATH or in the sbin
// directories) and reports its output on failure.
func run(ctx context.Context, argv ...string) error {
	bin, err := lookPath(argv[0])
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, bin, argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// tailBuffer keeps the last 4 KiB written to it, for error messages.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.b)) }
