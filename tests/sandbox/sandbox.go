package sandbox

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox/nodeagent"
	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// BinDirEnv names the environment variable that points at the directory
// holding the Kubernetes binaries (hack/build-kube.sh's OUTDIR).
const BinDirEnv = "ETCDBACKUP_KUBE_BIN_DIR"

// kubeBinaries are the binaries Start needs in the bin dir.
var kubeBinaries = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// ErrBinariesMissing is returned (wrapped) by Start when a Kubernetes binary
// is not in the bin dir. Tests use it to skip with a useful message.
var ErrBinariesMissing = errors.New("kube binaries missing (build them with `make kube-bins` or hack/build-kube.sh DIR)")

// Config says where the sandbox keeps its files and finds its binaries.
type Config struct {
	// Dir is the work dir (certs, etcd data, logs, kubeconfigs, the node's
	// Pods and volumes); required. Start owns it: state from an earlier
	// sandbox in it is replaced.
	Dir string
	// BinDir holds kube-apiserver, kube-controller-manager, kube-scheduler
	// and kubectl. Default: $ETCDBACKUP_KUBE_BIN_DIR, else <repo
	// root>/.cache/kube/bin (repo root: the nearest parent of the working
	// directory with this project's go.mod).
	BinDir string
	// Log receives progress lines for humans; nil discards them.
	Log io.Writer
	// Images is the node agent's image table: image name (registry, tag
	// and digest are ignored: "ghcr.io/x/etcdbackup-server:v1" is
	// "etcdbackup-server") → path of the host binary that is the image. The
	// binary appears in the container at /<image name>, the image's
	// entrypoint. Pods with other images stay Pending. SetImage adds more
	// later.
	Images map[string]string
}

// Sandbox is a running cluster. Its methods are safe for concurrent use.
type Sandbox struct {
	dir    string
	binDir string
	log    io.Writer

	pki               *pki
	etcd              *etcdServer
	apiserver         *apiserverProcess
	controllerManager *process
	scheduler         *process
	node              *nodeEndpoint
	agent             *nodeagent.Agent
	provisioner       *provisioner
	agentLog          *lockedFile

	kubeconfig string
	restConfig *rest.Config
	client     kubernetes.Interface

	klogFile *os.File

	stopOnce sync.Once
	stopErr  error
}

// Start brings up etcd, kube-apiserver, the node endpoint, the node agent,
// the volume provisioner, kube-controller-manager and kube-scheduler,
// registers the Node and returns once all of it is ready. On error it stops
// whatever it had started. ctx bounds the start only, not the sandbox's
// life: call Stop.
func Start(ctx context.Context, cfg Config) (_ *Sandbox, err error) {
	began := time.Now()
	if cfg.Dir == "" {
		return nil, errors.New("sandbox: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: resolve dir: %w", err)
	}
	binDir, err := ResolveBinDir(cfg.BinDir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := CheckBinaries(binDir); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	s := &Sandbox{dir: dir, binDir: binDir, log: logw}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()

	if err := resetDir(dir); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := s.redirectKlog(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	step := time.Now()
	if s.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		return nil, fmt.Errorf("sandbox: certificates: %w", err)
	}
	if s.etcd, err = startEtcd(ctx, dir, s.pki); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.logf("etcd ready at %s (%s)", s.etcd.clientURL, since(step))

	step = time.Now()
	if s.node, err = startNodeEndpoint(s.pki.node, s.pki.clientCA.cert); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if s.apiserver, err = startAPIServer(ctx, filepath.Join(binDir, "kube-apiserver"), dir, s.pki, s.etcd.clientURL, logw); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s.logf("kube-apiserver ready at %s (%s, log %s)", s.apiserver.url, since(step), s.apiserver.logPath)

	s.restConfig = s.configFor(s.pki.admin.certPEM, s.pki.admin.keyPEM)
	if s.client, err = kubernetes.NewForConfig(s.restConfig); err != nil {
		return nil, fmt.Errorf("sandbox: admin client: %w", err)
	}
	s.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := s.writeKubeconfig(s.kubeconfig, "sandbox-admin", s.pki.admin.certPEM, s.pki.admin.keyPEM); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := s.registerNode(ctx); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}

	// The controllers take the longest to be up; the node agent and the
	// provisioner start meanwhile.
	step = time.Now()
	controllersDone := make(chan error, 1)
	go func() { controllersDone <- s.startControllers(ctx, logw) }()
	agentErr := s.startNodeAgent(ctx, cfg.Images)
	if err := <-controllersDone; err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if agentErr != nil {
		return nil, fmt.Errorf("sandbox: %w", agentErr)
	}
	s.logf("kube-controller-manager, kube-scheduler and node agent ready (%s, logs in %s)", since(step), dir)
	s.logf("node %s registered, node endpoint https://127.0.0.1:%d; ready in %s; kubeconfig %s",
		NodeName, s.node.port, since(began), s.kubeconfig)
	return s, nil
}

// startNodeAgent starts the default StorageClass' provisioner and the node
// agent (the kubelet for the project's images) with their own identities.
func (s *Sandbox) startNodeAgent(ctx context.Context, images map[string]string) error {
	if err := ensureStorageClass(ctx, s.client); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(s.dir, "node-agent.log"))
	if err != nil {
		return fmt.Errorf("node agent log: %w", err)
	}
	s.agentLog = &lockedFile{f: f}
	nodeClient, err := kubernetes.NewForConfig(s.configFor(s.pki.nodeClient.certPEM, s.pki.nodeClient.keyPEM))
	if err != nil {
		return fmt.Errorf("node agent client: %w", err)
	}
	proxyClient, err := kubernetes.NewForConfig(s.configFor(s.pki.kubeProxy.certPEM, s.pki.kubeProxy.keyPEM))
	if err != nil {
		return fmt.Errorf("node agent proxy client: %w", err)
	}
	s.agent, err = nodeagent.New(nodeagent.Config{
		NodeName:      NodeName,
		Client:        nodeClient,
		ProxyClient:   proxyClient,
		StateDir:      filepath.Join(s.dir, "kubelet"),
		NodeRoot:      filepath.Join(s.dir, "node-root"),
		Images:        images,
		APIServerAddr: strings.TrimPrefix(s.apiserver.url, "https://"),
		ServiceCIDR:   netip.MustParsePrefix(ServiceCIDR),
		HostIP:        "127.0.0.1",
		Allocatable:   nodeCapacity,
		HandRunTarget: s.node.handRunTarget,
		Logf:          s.agentLog.logf,
	})
	if err != nil {
		return err
	}
	if err := s.agent.Start(ctx); err != nil {
		return err
	}
	s.node.setRuntime(s.agent)
	s.provisioner, err = startProvisioner(ctx, s.client, s.agent.NodePath, s.agentLog.logf)
	return err
}

// Stop stops the controllers, the node agent (every container it runs is
// killed, every Pod network namespace released), the apiserver (SIGTERM,
// then SIGKILL after 15 s), the node endpoint and etcd, in that order. It is
// idempotent and returns the first call's result. Files in Dir are left for
// inspection.
func (s *Sandbox) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		controllers := []*process{s.controllerManager, s.scheduler}
		stopErrs := make([]error, len(controllers))
		var wg sync.WaitGroup
		for i, p := range controllers {
			if p == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				stopErrs[i] = p.stop(15 * time.Second)
			}()
		}
		wg.Wait()
		for _, err := range stopErrs {
			if err != nil {
				errs = append(errs, err)
			}
		}
		if s.provisioner != nil {
			s.provisioner.stop()
		}
		if s.agent != nil {
			s.agent.Stop()
		}
		if s.apiserver != nil {
			if err := s.apiserver.stop(15 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		if s.node != nil {
			s.node.stop()
		}
		if s.etcd != nil {
			s.etcd.stop()
		}
		if s.klogFile != nil {
			klog.SetOutput(io.Discard)
			s.klogFile.Close()
		}
		if s.agentLog != nil {
			s.agentLog.close()
		}
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

// APIServerURL is the apiserver's https://127.0.0.1:PORT.
func (s *Sandbox) APIServerURL() string { return s.apiserver.url }

// APIServerPID is the kube-apiserver child's process id.
func (s *Sandbox) APIServerPID() int { return s.apiserver.cmd.Process.Pid }

// NodeEndpointPort is the node endpoint's (the "kubelet's") HTTPS port.
func (s *Sandbox) NodeEndpointPort() int { return s.node.port }

// Dir is the sandbox work dir (absolute).
func (s *Sandbox) Dir() string { return s.dir }

// DropForwardedConnections closes every live forwarded connection at the node
// endpoint, as if each pod-side connection broke, and returns how many it
// closed. Each affected port-forward sees an error on its error stream;
// client-go's port forwarder then ends the whole port-forward session ("lost
// connection to pod"), just as it does against a real kubelet.
func (s *Sandbox) DropForwardedConnections() int { return s.node.dropAll() }

// ForwardedConnections is the number of live forwarded connections at the
// node endpoint (one per connection a port-forward client opened).
func (s *Sandbox) ForwardedConnections() int { return s.node.liveForwards() }

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
	for _, name := range []string{"pki", "etcd", "apiserver-certs", "etcd.log", "kube-apiserver.log", "kubeconfig", "kubeconfigs",
		"kube-controller-manager.log", "kube-scheduler.log", "node-agent.log", "kubelet", "node-root"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("clean dir: %w", err)
		}
	}
	return nil
}

// ResolveBinDir applies Config.BinDir's defaults: explicit dir, else
// $ETCDBACKUP_KUBE_BIN_DIR, else <repo root>/.cache/kube/bin.
func ResolveBinDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv(BinDirEnv)
	}
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", fmt.Errorf("find kube bin dir: %w (set %s)", err, BinDirEnv)
		}
		dir = filepath.Join(root, ".cache", "kube", "bin")
	}
	return filepath.Abs(dir)
}

// CheckBinaries reports (wrapping ErrBinariesMissing) if a Kubernetes
// binary the sandbox runs is not an executable file in binDir.
func CheckBinaries(binDir string) error {
	for _, name := range kubeBinaries {
		fi, err := os.Stat(filepath.Join(binDir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%w: no executable %s in %s", ErrBinariesMissing, name, binDir)
		}
	}
	return nil
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
func (s *Sandbox) EtcdEndpoint() string { return s.etcd.clientURL }

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

// redirectKlog sends klog (where the kubelet streaming code reports every
// closed forward as an "Unhandled Error") to node.log in the sandbox dir
// instead of the terminal, where it would drown what a person reads.
func (s *Sandbox) redirectKlog() error {
	f, err := os.Create(filepath.Join(s.dir, "node.log"))
	if err != nil {
		return err
	}
	s.klogFile = f
	// Errors would still be copied to stderr (klog's stderrthreshold is
	// ERROR by default); only fatal ones may reach the terminal.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, value := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("klog flag %s: %w", name, err)
		}
	}
	klog.SetOutput(f)
	return nil
}

// lockedFile is a log file written from several goroutines.
type lockedFile struct {
	mu     sync.Mutex
	f      *os.File
	closed bool
}

func (l *lockedFile) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		fmt.Fprintf(l.f, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

func (l *lockedFile) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.f.Close()
}
