package sandbox

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// BinDirEnv names the environment variable that points at the directory
// holding the Kubernetes binaries (hack/build-kube.sh's OUTDIR).
const BinDirEnv = "ETCDBACKUP_KUBE_BIN_DIR"

// NodeDirEnv names the environment variable that points at the directory
// holding what the node runs besides the Kubernetes binaries (hack/node.mk's
// NODE_DIR): cni/bin/ (the CNI plugins), bin/ (coredns, pause) and images/
// (their image archives).
const NodeDirEnv = "ETCDBACKUP_NODE_DIR"

// kubeBinaries are the binaries Start needs in the bin dir.
var kubeBinaries = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet", "kube-proxy"}

// nodeFiles are the files Start needs in the node dir; CoreDNS as a
// binary or as its image archive.
var nodeFiles = [][]string{
	{"cni/bin/bridge"}, {"cni/bin/host-local"}, {"cni/bin/loopback"}, {"cni/bin/portmap"},
	{"bin/coredns", "images/coredns.tar"},
}

// hostTools are the programs of the machine the node needs (Debian's
// containerd, runc and nftables: hack/install-node-deps.sh).
var hostTools = []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "nft", "ip", "ss", "nsenter", "unshare"}

// ErrBinariesMissing is returned (wrapped) by Start when a binary is not
// in its bin dir. Tests use it to skip with a useful message.
var ErrBinariesMissing = errors.New("sandbox binaries missing (build them with `make node-bins`, install containerd, runc and nftables with hack/install-node-deps.sh)")

// Config says where the sandbox keeps its files and finds its binaries.
type Config struct {
	// Dir is the work dir (certs, etcd data, logs, kubeconfigs, the node's
	// private directories and volumes); required. Start owns it: state
	// from an earlier sandbox in it is replaced.
	Dir string
	// BinDir holds kube-apiserver, kube-controller-manager, kube-scheduler,
	// kubectl, kubelet and kube-proxy. Default: $ETCDBACKUP_KUBE_BIN_DIR,
	// else <repo root>/.cache/kube/bin (repo root: the nearest parent of
	// the working directory with this project's go.mod).
	BinDir string
	// NodeDir holds the CNI plugins (cni/bin/: bridge, host-local,
	// loopback, portmap), coredns, pause and, for NetworkPolicy,
	// kube-network-policies (bin/) and the image archives (images/; made
	// from bin/ when missing). Default: $ETCDBACKUP_NODE_DIR,
	// else <repo root>/.cache/node.
	NodeDir string
	// Log receives progress lines for humans; nil discards them.
	Log io.Writer
	// Images are OCI image archives (ociimage.WriteArchive, `make images`)
	// imported into the node's containerd before Start returns.
	// ImportImages adds more later.
	Images []string
	// NoWait makes Start fail at once (ErrBusy, naming the other one) when
	// another sandbox runs on this machine, instead of waiting for it.
	NoWait bool
	// Locked, when set, runs once Start holds the machine lock and before
	// it changes anything: the moment to record the machine's state (a
	// sandbox of another test process may have run until then).
	Locked func()
	// NetworkPolicy makes the node enforce NetworkPolicy, from the moment
	// Start returns, with kube-network-policies (`make netpol-bin`). On a
	// kernel that cannot run it Start fails with ErrNetworkPolicyUnsupported
	// (CheckNetworkPolicy tells beforehand). Without it NetworkPolicy
	// objects are accepted and ignored, as on a cluster whose network
	// plugin ignores them.
	NetworkPolicy bool
}

// Sandbox is a running cluster. Its methods are safe for concurrent use.
type Sandbox struct {
	dir     string
	binDir  string
	nodeDir string
	log     io.Writer

	// The references of the pause and CoreDNS images (systemImages).
	pauseImage, coreDNSImage string
	// networkPolicy is whether the node enforces NetworkPolicy.
	networkPolicy bool

	lock *machineLock
	pki  *pki
	etcd *etcdServer // set once; it may be stopped and started again
	node *node       // node 0, set once by Start

	// nodesMu guards node2 and what a node gets when it starts: archives,
	// every image archive imported so far (AddNode imports them all).
	nodesMu  sync.Mutex
	node2    *node
	archives []string
	// tags are TagImage's (ref, alias) pairs, which AddNode repeats.
	tags       [][2]string
	forwarders *forwarders

	// cpMu guards the control plane's state: StopControlPlane,
	// StartControlPlane and Stop hold it; so do the readers of what they
	// change (the processes, etcd's data directory).
	cpMu              sync.Mutex
	cpDown            bool // between StopControlPlane and StartControlPlane
	stopped           bool // Stop has run
	apiserver         *apiserverProcess
	controllerManager *process
	scheduler         *process
	provisioner       *provisioner

	apiserverURL string
	kubeconfig   string
	restConfig   *rest.Config
	client       kubernetes.Interface

	stopOnce sync.Once
	stopErr  error
}

// Start brings up etcd, kube-apiserver, the node (containerd, kubelet,
// kube-proxy and, with Config.NetworkPolicy, kube-network-policies in
// their own namespaces), kube-controller-manager,
// kube-scheduler, the volume provisioner and CoreDNS, and returns once the
// node is Ready and cluster DNS answers. It first takes the machine-wide
// sandbox lock (waiting for another sandbox to stop, or failing with
// ErrBusy if Config.NoWait). On error it stops whatever it had started.
// ctx bounds the start only, not the sandbox's life: call Stop.
func Start(ctx context.Context, cfg Config) (_ *Sandbox, err error) {
	if cfg.Dir == "" {
		return nil, errors.New("sandbox: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: resolve dir: %w", err)
	}
	binDir, nodeDir, err := ResolveBinDirs(cfg.BinDir, cfg.NodeDir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := CheckBinaries(binDir, nodeDir); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if cfg.NetworkPolicy {
		if err := checkNetworkPolicyBinary(nodeDir); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		if err := CheckNetworkPolicy(); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	s := &Sandbox{dir: dir, binDir: binDir, nodeDir: nodeDir, log: logw}
	if s.lock, err = lockMachine(ctx, dir, !cfg.NoWait, s.logf); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if cfg.Locked != nil {
		cfg.Locked()
	}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	began := time.Now()

	if err := resetDir(dir); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	step := time.Now()
	// Where kubeadm keeps them: /etc/kubernetes/pki (staticpods.go).
	if s.pki, err = newPKI(filepath.Join(dir, "kubernetes", "pki")); err != nil {
		return nil, fmt.Errorf("sandbox: certificates: %w", err)
	}
	// The node's network first: the API server and etcd listen on the
	// host end of its veth.
	if err := cleanupNode(); err != nil {
		return nil, fmt.Errorf("sandbox: clean up after an earlier sandbox: %w", err)
	}
	if err := setupNetwork(ctx); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	systemImages := make(chan imagesResult, 1)
	go func() { systemImages <- s.systemImages(ctx) }()
	if s.etcd, err = newEtcdServer(dir, s.pki); err != nil {
		return nil, fmt.Errorf("sandbox: etcd: %w", err)
	}
	if err := s.etcd.start(ctx, filepath.Join(dir, "etcd")); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.logf("etcd ready at %s (%s)", s.etcd.clientURL.String(), since(step))

	step = time.Now()
	if s.apiserver, err = startAPIServer(ctx, filepath.Join(binDir, "kube-apiserver"), dir, s.pki, s.etcd.clientURL.String(), 0, logw); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.apiserverURL = s.apiserver.url
	s.logf("kube-apiserver ready at %s (%s, log %s)", s.apiserver.url, since(step), s.apiserver.logPath)
	if err := s.writeStaticPods(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}

	s.restConfig = s.configFor(s.pki.admin.certPEM, s.pki.admin.keyPEM)
	if s.client, err = kubernetes.NewForConfig(s.restConfig); err != nil {
		return nil, fmt.Errorf("sandbox: admin client: %w", err)
	}
	s.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := s.writeKubeconfig(s.kubeconfig, "sandbox-admin", s.pki.admin.certPEM, s.pki.admin.keyPEM); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.forwarders = newForwarders()

	// The controllers and the node start side by side.
	step = time.Now()
	controllersDone := make(chan error, 1)
	go func() { controllersDone <- s.startControllers(ctx, logw) }()
	sys := <-systemImages
	nodeErr := sys.err
	if nodeErr == nil {
		s.archives = append(append([]string{}, sys.archives...), cfg.Images...)
		nodeErr = s.startNode(ctx, s.archives, cfg.NetworkPolicy)
	}
	if err := <-controllersDone; err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if nodeErr != nil {
		return nil, fmt.Errorf("sandbox: %w", nodeErr)
	}
	s.networkPolicy = cfg.NetworkPolicy
	s.logf("kube-controller-manager, kube-scheduler and node ready (%s, logs in %s)", since(step), dir)
	if err := ensureStorageClass(ctx, s.client); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if s.provisioner, err = startProvisioner(ctx, s.client, s.node.hostPath, s.logf); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	step = time.Now()
	if err := s.startDNS(ctx); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.logf("CoreDNS answering at %s (%s)", DNSServiceIP, since(step))
	s.logf("sandbox ready in %s; kubeconfig %s", since(began), s.kubeconfig)
	return s, nil
}

// Stop stops the controllers, the node (every process, mount, cgroup and
// link of it; see stopNode), the apiserver (SIGTERM, then SIGKILL after
// 15 s) and etcd, in that order, then releases the machine-wide lock. It
// is idempotent and returns the first call's result, and works with the
// control plane up or down (StopControlPlane). Files in Dir are left for
// inspection, the node's private directories too (its mounts are gone), as
// is an etcd data directory StartControlPlane was given.
func (s *Sandbox) Stop() error {
	s.stopOnce.Do(func() {
		s.cpMu.Lock()
		defer s.cpMu.Unlock()
		s.stopped = true
		var errs []error
		if err := s.stopControllers(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
		if err := s.stopNodes(); err != nil {
			errs = append(errs, err)
		}
		if s.forwarders != nil {
			s.forwarders.stop()
		}
		// The apiserver before etcd (with etcd gone first its graceful
		// shutdown hangs), and both before the node's network, whose host
		// end they listen on.
		if s.apiserver != nil {
			if err := s.apiserver.stop(15 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		if s.etcd != nil {
			s.etcd.stop()
		}
		if s.lock != nil {
			if err := cleanupNode(); err != nil {
				errs = append(errs, err)
			}
		}
		s.lock.release()
		s.stopErr = errors.Join(errs...)
		s.logf("stopped")
	})
	return s.stopErr
}

// Kubeconfig is the path of the admin (system:masters) kubeconfig.
func (s *Sandbox) Kubeconfig() string { return s.kubeconfig }

// RESTConfig returns a copy of the admin client configuration.
func (s *Sandbox) RESTConfig() *rest.Config { return rest.CopyConfig(s.restConfig) }

// Client is an admin clientset.
func (s *Sandbox) Client() kubernetes.Interface { return s.client }

// KubectlPath is the kubectl built with the apiserver (same version).
func (s *Sandbox) KubectlPath() string { return s.binPath("kubectl") }

func (s *Sandbox) binPath(name string) string { return filepath.Join(s.binDir, name) }

// APIServerURL is the apiserver's https://HostIP:PORT; it stays the same
// across StopControlPlane and StartControlPlane.
func (s *Sandbox) APIServerURL() string { return s.apiserverURL }

// APIServerPID is the kube-apiserver child's process id (the last one's
// while the control plane is down).
func (s *Sandbox) APIServerPID() int {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	return s.apiserver.cmd.Process.Pid
}

// EncryptionConfigFile is the API server's EncryptionConfiguration
// (--encryption-provider-config): Secrets are encrypted at rest with its
// aescbc key EncryptionKeyName.
func (s *Sandbox) EncryptionConfigFile() string { return s.pki.encryptionConfigFile }

// Dir is the sandbox work dir (absolute).
func (s *Sandbox) Dir() string { return s.dir }

func (s *Sandbox) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "sandbox: "+format+"\n", args...)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

// resetDir creates dir and removes what an earlier sandbox left in it, so
// etcd never starts on stale data signed by keys that no longer exist.
func resetDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create dir: %w", err)
	}
	// An etcd data directory a restore made next to the first one
	// (etcd-restored, etcd.before-restore-…) goes too.
	for _, pattern := range []string{"etcd-*", "etcd.before-restore-*"} {
		old, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, path := range old {
			if err := os.RemoveAll(path); err != nil {
				return fmt.Errorf("clean dir: %w", err)
			}
		}
	}
	for _, name := range []string{"kubernetes", "pki", "etcd", "apiserver-certs", "etcd.log", "kube-apiserver.log", "kubeconfig", "kubeconfigs",
		"kube-controller-manager.log", "kube-scheduler.log", "containerd.log", "kubelet.log", "kube-proxy.log", "kube-network-policies.log", "node", "node-config",
		"containerd-2.log", "kubelet-2.log", "kube-proxy-2.log", "kube-network-policies-2.log", "node-2", "node-2-config"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("clean dir: %w", err)
		}
	}
	return nil
}

// ResolveBinDirs applies Config.BinDir's and Config.NodeDir's defaults:
// explicit dir, else the environment variable, else the dir under <repo
// root>/.cache.
func ResolveBinDirs(binDir, nodeDir string) (string, string, error) {
	var err error
	if binDir, err = resolveDir(binDir, BinDirEnv, "kube/bin"); err != nil {
		return "", "", err
	}
	if nodeDir, err = resolveDir(nodeDir, NodeDirEnv, "node"); err != nil {
		return "", "", err
	}
	return binDir, nodeDir, nil
}

func resolveDir(dir, env, cache string) (string, error) {
	if dir == "" {
		dir = os.Getenv(env)
	}
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", fmt.Errorf("find .cache/%s: %w (set %s)", cache, err, env)
		}
		dir = filepath.Join(root, ".cache", cache)
	}
	return filepath.Abs(dir)
}

// CheckBinaries reports (wrapping ErrBinariesMissing) if a binary the
// sandbox runs is missing: from binDir, from nodeDir, or from PATH.
func CheckBinaries(binDir, nodeDir string) error {
	var missing []string
	for _, name := range kubeBinaries {
		if !isFile(filepath.Join(binDir, name)) {
			missing = append(missing, filepath.Join(binDir, name))
		}
	}
	for _, alternatives := range nodeFiles {
		found := false
		for _, name := range alternatives {
			found = found || isFile(filepath.Join(nodeDir, name))
		}
		if !found {
			missing = append(missing, filepath.Join(nodeDir, alternatives[0]))
		}
	}
	for _, name := range hostTools {
		if _, err := lookPath(name); err != nil {
			missing = append(missing, name+" (on PATH)")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: no %s", ErrBinariesMissing, strings.Join(missing, ", "))
	}
	return nil
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// lookPath finds a host tool on PATH or in the sbin directories a
// non-login PATH may lack.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range strings.Split(nodePATH, ":") {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// rootModule is the module path of the project's own go.mod; the tools
// module (tools/kube) has a go.mod too, which must not be taken for the root.
const rootModule = "github.com/kubectl-etcdbackup/kubectl-etcdbackup"

// repoRoot walks up from the working directory to the project's go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if modulePath(filepath.Join(dir, "go.mod")) == rootModule {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory", rootModule)
		}
		dir = parent
	}
}

func modulePath(gomod string) string {
	f, err := os.Open(gomod)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// EtcdEndpoint is the client URL (https) of the etcd the API server stores
// its objects in: the cluster's own control-plane etcd.
// It stays the same across StopControlPlane and StartControlPlane.
func (s *Sandbox) EtcdEndpoint() string { return s.etcd.clientURL.String() }

// EtcdClientTLS returns the files of a client certificate etcd accepts
// (CN=etcdbackup) and of etcd's CA: what a kubeadm operator would put in
// the Secret a backup target names.
func (s *Sandbox) EtcdClientTLS() (caFile, certFile, keyFile string) {
	return s.pki.etcdCA.certFile, s.pki.etcdBackupClient.certFile, s.pki.etcdBackupClient.keyFile
}

// EtcdClientConfig returns a TLS config for clients of EtcdEndpoint.
func (s *Sandbox) EtcdClientConfig() (*tls.Config, error) {
	ca, cert, key := s.EtcdClientTLS()
	return transport.TLSInfo{TrustedCAFile: ca, CertFile: cert, KeyFile: key}.ClientConfig()
}
