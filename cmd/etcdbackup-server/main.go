// Command etcdbackup-server is the in-cluster data server: it holds the
// storage credentials and serves the etcdbackup.v1 gRPC API to the kubectl
// plugin (through a port-forward) and to the backup and restore agents.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/agenttls"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/coord"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/leader"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "etcdbackup-server:", err)
		os.Exit(1)
	}
}

// options are the server's flags.
type options struct {
	listen, agentListen string
	healthListen        string
	kubeconfig          string
	storageDir          string
	configFile          string
	namespace, podName  string
	metricsListen       string
	drain               time.Duration
	showVersion         bool
	checkLocations      bool
}

// parseFlags reads the command line.
func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("etcdbackup-server", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:50051", "address of the user API (the plugin's): keep it on loopback, where port-forward connections arrive; never the pod IP")
	fs.StringVar(&o.agentListen, "agent-listen", "", "address of the agent API, the Service's only port (empty: off; agents then cannot reach the server)")
	fs.StringVar(&o.healthListen, "health-listen", "", "address serving grpc.health.v1 Check alone, in plaintext, for the kubelet's gRPC probes (the agent port speaks TLS, which they do not); empty: off")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for the Kubernetes API (default: in-cluster service account)")
	fs.StringVar(&o.storageDir, "storage-dir", "/var/lib/etcdbackup", "directory of the \"default\" filesystem storage location (mount a PersistentVolumeClaim here); ignored with --config")
	fs.StringVar(&o.configFile, "config", "", "configuration file: storage locations, etcd targets, agents (see docs/design.md)")
	fs.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the server's namespace, where agent Jobs run (default $POD_NAMESPACE)")
	fs.StringVar(&o.podName, "pod-name", os.Getenv("POD_NAME"), "the server's own pod, whose init container \""+jobs.AgentImageContainer+"\" names the agent image when the config's agents.image does not (default $POD_NAME)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "address serving Prometheus /metrics (empty: off)")
	fs.DurationVar(&o.drain, "shutdown-timeout", 60*time.Second, "how long in-flight transfers may finish after SIGTERM")
	fs.BoolVar(&o.checkLocations, "check-locations", true, "check every available storage location once at start, in the background, as kubectl etcdbackup location check does (probe objects written, read, listed and deleted), logging each failed step as a warning")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return o, nil
}

func run(args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	if o.showVersion {
		fmt.Println(version.Version)
		return nil
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	setMemoryLimit(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	f, err := loadConfig(o)
	if err != nil {
		return err
	}
	if err := checkUserListen(o.listen, f.Authorization.Mode); err != nil {
		return err
	}
	cfg := server.Config{Logger: log, Targets: f.Targets, Limits: f.Limits, CheckLocations: o.checkLocations}
	if cfg.Locations, err = locations.Open(ctx, f.Locations, locations.Options{Logger: log}); err != nil {
		return err
	}
	if err := kubernetesParts(ctx, o, f, &cfg, log); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	ls, err := listen(o)
	if err != nil {
		return err
	}
	if o.metricsListen != "" {
		defer serveMetrics(o.metricsListen, reg, log)()
	}
	logServing(log, cfg, f, ls)
	// Start-up is over: what it alone needed of the binary can go.
	if err := releaseBinaryPages(); err != nil {
		log.Debug("cannot release the binary's start-up pages", "error", err)
	}
	return srv.Serve(ctx, ls, o.drain)
}

// kubernetesParts fills in the parts of cfg that use the Kubernetes API:
// the launcher of agent Jobs (started), the election, the replicas'
// coordination, the guards of both listeners and the agent port's TLS.
func kubernetesParts(ctx context.Context, o *options, f *config.File, cfg *server.Config, log *slog.Logger) error {
	kc, err := kubernetesAccess(o, f)
	if err != nil {
		return err
	}
	if err := resolveAgentImage(ctx, o, f, kc); err != nil {
		return err
	}
	if cfg.Agents, err = agents(o, f, kc, log); err != nil {
		return err
	}
	if cfg.Agents != nil {
		// Delta agents hold their Leases through the server: renewals go
		// on a client of their own, so that they neither wait on Job
		// creation nor hold it up.
		lc, err := leaseClient(o.kubeconfig)
		if err != nil {
			return err
		}
		cfg.Agents.SetDeltaLeaseClient(lc)
		if err := startAgents(ctx, cfg.Agents, o.podName, f.Targets, log); err != nil {
			return err
		}
		if cfg.Leader, err = election(kc, o, log); err != nil {
			return err
		}
	}
	if cfg.Coordination, err = coordination(kc, o, f, log); err != nil {
		return err
	}
	cfg.HandOffDownloads = f.Replicas > 1
	rc, urc := kc, kc
	if kc != nil {
		if rc, err = reviewClient(o.kubeconfig); err != nil {
			return err
		}
		// The user listener's reviews get a limiter of their own too: a
		// flood there must not take the agents' reviews.
		if urc, err = reviewClient(o.kubeconfig); err != nil {
			return err
		}
	}
	if cfg.UserGuard, cfg.AgentGuard, err = guards(kc, rc, urc, o.namespace, f, cfg.Agents); err != nil {
		return err
	}
	// The server's keys follow their Secrets (followKeys), on one loop
	// owned by ctx, the server's.
	var keys []followedKey
	if cfg.Agents != nil {
		keys = append(keys, signingKey(cfg.Agents))
	}
	if o.agentListen != "" {
		var ca *agenttls.Current
		if cfg.AgentTLS, ca, err = agentTLS(ctx, kc, o.namespace, f, cfg.Agents, log); err != nil {
			return err
		}
		keys = append(keys, agentCA(ca))
	}
	if len(keys) > 0 {
		t := time.NewTicker(keyFollowInterval)
		go func() {
			defer t.Stop()
			followKeys(ctx, t.C, log, o.namespace, keys...)
		}()
	}
	return nil
}

// startAgents readies launcher l before the server serves: the key that
// signs agent Jobs is read back (or made, the first time) before any Job
// is created or admitted, and the agents' Jobs, pods and events are read
// from informers, filled here.
func startAgents(ctx context.Context, l *jobs.Launcher, serverPod string, targets []config.Target, log *slog.Logger) error {
	l.SetServerPod(serverPod)
	if err := l.LoadSigningKey(ctx); err != nil {
		return err
	}
	return l.Start(ctx, targets)
}

// loadConfig reads --config; without it, the server has one filesystem
// location in --storage-dir and no targets.
func loadConfig(o *options) (*config.File, error) {
	if o.configFile != "" {
		return config.Load(o.configFile)
	}
	return &config.File{Locations: []storage.LocationConfig{{Name: "default", Filesystem: &storage.FilesystemConfig{Path: o.storageDir}}}}, nil
}

// kubernetesAccess returns a client of the Kubernetes API when the server
// needs one — agents, its own pod's agent image, the agent listener, or
// strict authorization — and fills in its namespace; nil otherwise.
func kubernetesAccess(o *options, f *config.File) (kubernetes.Interface, error) {
	if f.Agents.Image == "" && o.podName == "" && o.agentListen == "" && f.Authorization.Mode != config.AuthorizationSubjectAccessReview {
		return nil, nil
	}
	kc, err := kubeClient(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	if o.namespace == "" {
		if o.namespace, err = inClusterNamespace(); err != nil {
			return nil, err
		}
	}
	return kc, nil
}

// resolveAgentImage sets the agent image: the config's override, else
// the image kustomize wrote into this pod's init container.
func resolveAgentImage(ctx context.Context, o *options, f *config.File, kc kubernetes.Interface) error {
	if f.Agents.Image != "" || o.podName == "" {
		return nil
	}
	var err error
	f.Agents.Image, err = jobs.AgentImage(ctx, kc, o.namespace, o.podName)
	return err
}

// agents returns the launcher of agent Jobs, or nil when no agent image
// is known (the server then launches none).
func agents(o *options, f *config.File, kc kubernetes.Interface, log *slog.Logger) (*jobs.Launcher, error) {
	if f.Agents.Image != "" && o.agentListen == "" {
		return nil, errors.New("an agent image is configured but --agent-listen is empty: agents could not reach the server")
	}
	if f.Agents.Image != "" {
		return jobs.New(kc, o.namespace, f.Agents)
	}
	if len(f.Targets) > 0 {
		log.Warn("targets are configured but no agent image is (agents.image, or the init container " + jobs.AgentImageContainer + " of the server's pod): on-demand backups are off")
	}
	return nil, nil
}

// election is how the replicas choose the one that runs the controller
// (server/leader), which only a server launching agents has work for.
// Every server that has it takes part, one replica too: during a
// rolling update the old pod and the new one overlap.
func election(kc kubernetes.Interface, o *options, log *slog.Logger) (*leader.Elector, error) {
	pod := o.podName
	if pod == "" {
		// Out of a pod (--kubeconfig): the host names the replica; without
		// it the random part of the identity alone does.
		pod, _ = os.Hostname()
	}
	id, err := leader.NewIdentity(pod)
	if err != nil {
		return nil, err
	}
	return leader.New(leader.Config{Client: kc, Namespace: o.namespace, Identity: id, Logger: log})
}

// coordination is where the replicas agree on upload names and on the
// backups being sent or removed (server/coord): Leases in the server's
// namespace when the config runs several replicas, this replica's memory
// otherwise. The Leases' renewals and deletions need the Role of the HA
// component (manifests/components/ha/role.yaml).
func coordination(kc kubernetes.Interface, o *options, f *config.File, log *slog.Logger) (coord.Registry, error) {
	if f.Replicas <= 1 {
		return nil, nil
	}
	if kc == nil {
		return nil, fmt.Errorf("replicas: %d needs the Kubernetes API, where the replicas agree on upload names and on the backups being sent; run the server in its pod, or with --kubeconfig", f.Replicas)
	}
	id := cmp.Or(o.podName, os.Getenv("HOSTNAME"))
	return coord.NewLeases(coord.LeasesConfig{Client: kc, Namespace: o.namespace, Identity: id, Logger: log})
}

// listen opens the user listener and, with --agent-listen, the agents'.
func listen(o *options) (server.Listeners, error) {
	var ls server.Listeners
	var err error
	if ls.Users, err = net.Listen("tcp", o.listen); err != nil {
		return ls, fmt.Errorf("listen on %s (--listen): %w", o.listen, err)
	}
	if o.agentListen != "" {
		if ls.Agents, err = net.Listen("tcp", o.agentListen); err != nil {
			return ls, fmt.Errorf("listen on %s (--agent-listen): %w", o.agentListen, err)
		}
	}
	if o.healthListen != "" {
		if ls.Health, err = net.Listen("tcp", o.healthListen); err != nil {
			return ls, fmt.Errorf("listen on %s (--health-listen): %w", o.healthListen, err)
		}
	}
	return ls, nil
}

// serveMetrics serves reg's /metrics on addr until the returned func
// closes it.
func serveMetrics(addr string, reg *prometheus.Registry, log *slog.Logger) (closeServer func()) {
	m := &http.Server{Addr: addr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := m.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "error", err)
		}
	}()
	return func() { m.Close() }
}

// logServing says what the server serves, and where.
func logServing(log *slog.Logger, cfg server.Config, f *config.File, ls server.Listeners) {
	var where []string
	for _, l := range cfg.Locations {
		where = append(where, l.Name+"="+l.Location.Describe())
	}
	attrs := []any{"version", version.Version, "listen", ls.Users.Addr().String(), "locations", where,
		"authorization", cmp.Or(f.Authorization.Mode, config.AuthorizationPortForward), "replicas", max(f.Replicas, 1)}
	if ls.Agents != nil {
		attrs = append(attrs, "agentListen", ls.Agents.Addr().String(), "agentTransport", agenttls.Describe(cfg.AgentTLS))
	}
	if ls.Health != nil {
		attrs = append(attrs, "healthListen", ls.Health.Addr().String())
	}
	log.Info("serving", attrs...)
}

// The garbage collector's soft limit is the smaller of memoryLimitRatio
// of the container's memory limit and that limit less binaryReserve: the
// Go runtime does not count the page cache of the binary's code, which
// the container's limit does, and with less than about 30 MiB of it left
// the kernel evicts the code being run over and over (measured: an S3
// upload under a 64 MiB limit, with 36 MiB of heap, stalled on page
// faults until the client gave up; a filesystem upload ran).
const (
	defaultGCPercent = 25
	memoryLimitRatio = 0.9
	binaryReserve    = 32 << 20
)

// setMemoryLimit sets the garbage collector's soft limit
// (runtime/debug.SetMemoryLimit) from the cgroup's memory limit, unless
// GOMEMLIMIT is set (or AUTOMEMLIMIT=off). Without it the collector lets
// the heap grow to twice what is live whatever the limit, and an S3
// upload's part buffers alone make that more than a tight limit holds;
// with it the collector works harder as the limit nears instead of the
// container being killed.
func setMemoryLimit(log *slog.Logger) {
	// What the server holds live is mostly transfer buffers (pooled
	// chunks, S3 parts: no pointers, cheap to mark), so a collection
	// costs little and the default GOGC=100, which lets the heap reach
	// twice what is live, mostly buys resident memory: an S3 upload's
	// ≈ 25 MiB of parts became ≈ 55 MiB of heap. GOGC overrides it.
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	provider := func() (uint64, error) {
		l, err := memlimit.FromCgroup()
		if err != nil {
			return 0, err
		}
		return min(uint64(float64(l)*memoryLimitRatio), l-min(l/2, binaryReserve)), nil
	}
	limit, err := memlimit.Set(memlimit.WithProvider(provider), memlimit.WithRatio(1))
	switch {
	case err != nil:
		log.Info("no memory limit found for the garbage collector", "error", err)
	case limit < math.MaxInt64:
		log.Info("garbage collector memory limit", "bytes", limit)
	}
}

// kubeClient talks to the API server as the pod's service account, or as
// kubeconfig says.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the server needs the Kubernetes API (agents, or authorization of calls): %w", err)
	}
	// Agent Jobs, pods and events come from informers (jobs.Launcher):
	// reading them costs no request (a List of 500 backups' Jobs took 56
	// before), and the agent guard checks callers against them (its
	// reads where they cannot tell are bounded: auth.AgentLookups); the
	// reviews of both listeners run on clients of their own. What is left
	// is per action: a create, delete or patch per agent Job, leader
	// election and coordination Leases. Twice client-go's default rate
	// (5/s, burst 10) keeps those from queueing on the server's own
	// limiter; the burst takes start-up's lists and watches (3 each per
	// namespace agents run in) at once.
	rc.QPS, rc.Burst = 10, 30
	return kubernetes.NewForConfig(rc)
}

// restConfig is the pod's service account's, or what kubeconfig says.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// reviewClient is a client of TokenReviews (and, for the user listener,
// SubjectAccessReviews): its own rate limiter, so that tokens sent by
// anyone who reaches a listener cannot use up the server's
// (auth.AgentReviews and auth.UserReviews bound the reviews in flight,
// and cache their answers).
func reviewClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the agent listener's TokenReview client: %w", err)
	}
	rc.QPS, rc.Burst = 10, 20
	rc.Timeout = auth.DefaultReviewTimeout
	return kubernetes.NewForConfig(rc)
}

// leaseClient is the client of the delta agents' Leases
// (jobs.Launcher.SetDeltaLeaseClient): a renewal of each target every
// 2 s, a read per stored segment, a read of each waiting agent every 2 s.
func leaseClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the delta Leases' client: %w", err)
	}
	rc.QPS, rc.Burst = 20, 40
	return kubernetes.NewForConfig(rc)
}

// agentTLS makes the agent listener's TLS (server/agenttls): the CA in
// Secret agentjob.AgentCASecret (which the caller follows), a serving certificate for the Service's
// names and agents.serverAddress, the CA certificate published in every
// namespace agents run in.
func agentTLS(ctx context.Context, kc kubernetes.Interface, namespace string, f *config.File, launcher *jobs.Launcher, log *slog.Logger) (*tls.Config, *agenttls.Current, error) {
	var others []string
	if launcher != nil {
		others = launcher.RestoreNamespaces(f.Targets)
	}
	cfg, current, err := agenttls.Setup(ctx, agenttls.Options{
		Client: kc, Namespace: namespace, AgentNamespaces: others,
		ServerAddresses: []string{f.Agents.WithDefaults(namespace).ServerAddress}, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	if launcher != nil {
		launcher.SetServerCAPublisher(current.Publish)
	}
	return cfg, current, nil
}

func inClusterNamespace() (string, error) {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return "", errors.New("the server's namespace is unknown: set --namespace or POD_NAMESPACE")
	}
	return strings.TrimSpace(string(b)), nil
}

// guards returns who may call the user and the agent listener; rc makes
// the agent listener's TokenReviews, urc the user listener's reviews.
func guards(kc, rc, urc kubernetes.Interface, namespace string, f *config.File, launcher *jobs.Launcher) (users, agents auth.Guard, err error) {
	if f.Authorization.Mode == config.AuthorizationSubjectAccessReview {
		users = &auth.SubjectAccessReviewGuard{Client: kc, Namespace: namespace, Reviews: auth.UserReviews{Client: urc}}
	}
	if launcher == nil {
		// No agents are launched, so none may call: the agent listener
		// refuses everything (server.Config.AgentGuard nil).
		return users, nil, nil
	}
	// Callers are checked against the Launcher's informers (started by
	// startAgents before the server serves), not with reads per call.
	pods, jl := auth.InformerListers(launcher.AgentInformers)
	ag, err := auth.NewAgentGuard(auth.AgentGuardConfig{
		Client:            kc,
		Namespace:         namespace,
		RestoreNamespaces: launcher.RestoreNamespaces(f.Targets),
		ServiceAccount:    f.Agents.WithDefaults(namespace).ServiceAccount,
		Reviews:           auth.AgentReviews{Client: rc},
		Pods:              pods,
		Jobs:              jl,
		Signer:            launcher,
		TargetNamespaces:  launcher.TargetNamespaces(f.Targets),
	})
	if err != nil {
		return nil, nil, err
	}
	return users, ag, nil
}
