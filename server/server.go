// Package server is the request layer of the etcdbackup data server: it
// validates requests, maps them onto named storage locations, enforces
// integrity (sizes and SHA-256) and turns outcomes into gRPC status codes a
// client can act on. Requests reach storage only through storage.Location;
// the configured locations are opened, and their availability tracked, by
// package storage/locations.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation/field"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

const (
	// MaxChunkBytes is the largest chunk accepted or sent on a stream. It
	// bounds the memory a stream holds, whatever the backup's size.
	MaxChunkBytes = 1 << 20
	// MaxNameLength keeps NAME.json within the 255-byte file-name limit of
	// common file systems; S3 keys allow more, names must work everywhere.
	MaxNameLength = 200
	// downloadChunkBytes is what the server sends per message: just under
	// gRPC's 1 MiB pooled buffer size, so each message takes one buffer
	// (a 256 KiB message would take, and zero, a 1 MiB buffer anyway).
	downloadChunkBytes = 1<<20 - 64
)

// NamedLocation is a storage location and the name clients address it by
// (locations.Open returns them).
type NamedLocation = locations.Named

// Config is what a Server needs.
type Config struct {
	// Locations in order; the first is the default.
	Locations []NamedLocation
	Logger    *slog.Logger
	// Registerer receives the server's Prometheus metrics; nil skips them.
	Registerer prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Targets are the etcd clusters CreateBackup can back up; the first is
	// the default. New checks them with config.ValidateTargets.
	Targets []config.Target
	// Agents launches backup agents; nil means CreateBackup is refused.
	Agents *jobs.Launcher
	// ScratchDir holds temporary files of VerifyBackup; "" is os.TempDir().
	ScratchDir string
	// UserGuard admits calls on the user listener; nil admits every call
	// (PortForward mode: the listener is the pod's loopback).
	UserGuard auth.Guard
	// AgentGuard admits calls on the agent listener; nil refuses every
	// call there, since agents could not be told apart from anyone else.
	AgentGuard auth.Guard
	// Limits bound what clients can make the server hold; zero fields
	// take their defaults (config.Limits.WithDefaults).
	Limits config.Limits
	// PollInterval is how often Serve looks at agent Jobs (to count
	// finished runs and apply retention) and at the schedules; 0 means
	// DefaultPollInterval.
	PollInterval time.Duration
}

// Listeners are where a Server serves.
type Listeners struct {
	// Users is the plugin's API: bind it to the pod's loopback, where the
	// kubelet delivers port-forward connections, never to the pod IP.
	Users net.Listener
	// Agents is the agents' API, the only port of the Service; nil
	// serves none.
	Agents net.Listener
}

// Server implements the etcdbackup.v1 services.
type Server struct {
	ebv1.UnimplementedInfoServiceServer
	ebv1.UnimplementedBackupServiceServer

	locations map[string]storage.Location
	order     []string
	log       *slog.Logger
	now       func() time.Time
	metrics   *metrics.Metrics
	health    *health.Server

	targets    []config.Target
	agents     *jobs.Launcher
	scratchDir string
	userGuard  auth.Guard
	agentGuard auth.Guard

	limits config.Limits

	mu       sync.Mutex
	inflight map[string]bool // "location/name" of uploads in progress
	uploads  map[string]int  // uploads in progress, by location

	pollInterval time.Duration
	inUse        *retention.InUse
	pruner       *retention.Pruner
}

// New checks the configuration and returns a Server.
func New(cfg Config) (*Server, error) {
	if len(cfg.Locations) == 0 {
		return nil, errors.New("at least one storage location is required")
	}
	s := &Server{
		locations: map[string]storage.Location{},
		log:       cfg.Logger,
		now:       cfg.Now,
		health:    health.NewServer(),
		inflight:  map[string]bool{},
		uploads:   map[string]int{},
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	for _, l := range cfg.Locations {
		s.locations[l.Name] = l.Location
		s.order = append(s.order, l.Name)
	}
	errs := storage.ValidateLocationNames(s.order, field.NewPath("locations"))
	errs = append(errs, config.ValidateTargets(cfg.Targets, s.order, field.NewPath("targets"))...)
	errs = append(errs, config.ValidateLimits(cfg.Limits, field.NewPath("limits"))...)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	s.targets, s.agents, s.scratchDir = cfg.Targets, cfg.Agents, cfg.ScratchDir
	s.limits = cfg.Limits.WithDefaults()
	s.userGuard, s.agentGuard = cfg.UserGuard, cfg.AgentGuard
	s.pollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	if s.userGuard == nil {
		s.userGuard = auth.AllowAll{}
	}
	if s.agentGuard == nil {
		s.agentGuard = refuseAll{}
	}
	m, err := metrics.New(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.inUse = retention.NewInUse(s.agents, s.targets)
	s.pruner = &retention.Pruner{InUse: s.inUse, Metrics: m, Log: s.log, Now: s.now}
	return s, nil
}

// register adds the etcdbackup and grpc.health.v1 services to g, which
// must have GRPCServerOptions (downloads need its codec).
func (s *Server) register(g *grpc.Server) {
	ebv1.RegisterInfoServiceServer(g, s)
	ebv1.RegisterBackupServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	// SERVING even while a storage location is unavailable: a failing
	// readiness probe would take the server out of its Service, cutting
	// agents off from the locations that work, and a restart cannot bring
	// back a remote store; the location reports itself in
	// GetServerInfo and in the errors of calls to it instead.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ebv1.BackupService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// GRPCServerOptions are the options the server's streams need.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		// A chunk plus framing must fit in a message.
		grpc.MaxRecvMsgSize(MaxChunkBytes + 64<<10),
		// Clients ping every 20 s to notice a dead port-forward tunnel;
		// the default policy would answer that with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Download chunks go out from pooled buffers without a copy;
		// upload chunks are copied once, into buffers the handler
		// returns (codec.go).
		grpc.ForceServerCodecV2(newChunkCodec()),
		// Received frames are not cleared before they are filled.
		experimental.BufferPool(recvBuffers),
	}
}

// refuseAll is the agent listener's guard when the server cannot
// authenticate agents (it runs without a Kubernetes client).
type refuseAll struct{}

func (refuseAll) Admit(context.Context, string) (context.Context, error) {
	return nil, status.Error(codes.Unauthenticated, "this server cannot authenticate agents: it runs without access to the Kubernetes API")
}

// NewGRPCServer returns a gRPC server with the etcdbackup and health
// services whose calls g admits.
func (s *Server) NewGRPCServer(g auth.Guard) *grpc.Server {
	onPanic := recovery.WithRecoveryHandlerContext(s.recovered)
	opts := append(GRPCServerOptions(),
		grpc.MaxConcurrentStreams(s.limits.MaxConcurrentStreams),
		// Recovery is outermost: a panic in the guard is caught too.
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(onPanic), auth.UnaryInterceptor(g)),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(onPanic), auth.StreamInterceptor(g)))
	srv := grpc.NewServer(opts...)
	s.register(srv)
	return srv
}

// recovered turns a handler's panic into INTERNAL for its caller, so a
// bug met by one request (a crafted file, say) does not stop the server
// and every transfer in it. The panic value and stack go to the log
// only: they may hold data the caller may not see.
//
// ctx is the call's before the guard admitted it, so it names the peer,
// not the authenticated caller.
func (s *Server) recovered(ctx context.Context, p any) error {
	method, _ := grpc.Method(ctx)
	var from string
	if pr, ok := peer.FromContext(ctx); ok {
		from = pr.Addr.String()
	}
	s.log.Error("panic in a request handler", "method", method, "peer", from, "panic", p, "stack", string(debug.Stack()))
	return status.Error(codes.Internal, "internal error; see the server log")
}

// Serve serves ls until ctx is done, then stops accepting, reports
// NOT_SERVING to health checks, lets in-flight streams finish for up to
// drain, and stops. It returns when every listener has stopped.
func (s *Server) Serve(ctx context.Context, ls Listeners, drain time.Duration) error {
	servers := []*grpc.Server{s.NewGRPCServer(s.userGuard)}
	listeners := []net.Listener{ls.Users}
	if ls.Agents != nil {
		servers = append(servers, s.NewGRPCServer(s.agentGuard))
		listeners = append(listeners, ls.Agents)
	}
	errc := make(chan error, len(servers))
	for i, g := range servers {
		go func() { errc <- g.Serve(listeners[i]) }()
	}
	// The scheduler and run observer stop with Serve: with ctx, or when a
	// listener fails.
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	watch.Go(func() { s.watch(watchCtx) })
	defer watch.Wait()
	defer stopWatch()
	var err error
	select {
	case err = <-errc:
		// One listener failed: stop the others too.
	case <-ctx.Done():
	}
	s.log.Info("shutting down: draining in-flight requests", "timeout", drain)
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, g := range servers {
			wg.Go(g.GracefulStop)
		}
		wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
		s.log.Info("drained")
	case <-time.After(drain):
		s.log.Warn("drain timeout passed: cancelling remaining requests")
		for _, g := range servers {
			g.Stop()
		}
		<-stopped
	}
	remaining := len(servers)
	if err != nil {
		remaining--
	}
	for range remaining {
		if e := <-errc; err == nil {
			err = e
		}
	}
	return err
}

// GetServerInfo implements ebv1.InfoServiceServer.
func (s *Server) GetServerInfo(context.Context, *ebv1.GetServerInfoRequest) (*ebv1.GetServerInfoResponse, error) {
	resp := &ebv1.GetServerInfoResponse{
		Version:   version.Version,
		GitCommit: version.Commit(),
		Limits: &ebv1.ServerLimits{
			MaxChunkBytes: MaxChunkBytes,
			MaxNameLength: MaxNameLength,
		},
	}
	for i, t := range s.targets {
		resp.Targets = append(resp.Targets, &ebv1.EtcdTarget{Name: t.Name, Endpoints: t.Endpoints, Default: i == 0})
	}
	for i, name := range s.order {
		l := s.locations[name]
		sl := &ebv1.StorageLocation{
			Name:        name,
			Type:        l.Type(),
			Default:     i == 0,
			Description: l.Describe(),
		}
		var ue *locations.UnavailableError
		if errors.As(unavailable(name, l), &ue) {
			sl.Unavailable = true
			sl.Error = fmt.Sprintf("%v (since %s)", ue.Err, ue.Since.UTC().Format(time.RFC3339))
		}
		resp.Locations = append(resp.Locations, sl)
	}
	return resp, nil
}

// location resolves a request's location name ("" is the default).
func (s *Server) location(name string) (string, storage.Location, error) {
	if name == "" {
		name = s.order[0]
	}
	l, ok := s.locations[name]
	if !ok {
		return "", nil, status.Errorf(codes.NotFound,
			"storage location %q does not exist on this server; it has %v (see `kubectl etcdbackup version`)", name, s.order)
	}
	if err := unavailable(name, l); err != nil {
		return "", nil, ebv1.LocationUnavailableError(name, err.Error())
	}
	return name, l, nil
}

// unavailable is the UnavailableError of a location that cannot be used
// now, or nil.
func unavailable(name string, l storage.Location) error {
	since, err := locations.Status(l)
	if err == nil {
		return nil
	}
	return &locations.UnavailableError{Location: name, Since: since, Err: err}
}

// claim marks an upload of name in loc as in progress, so a second upload
// of the same name is refused at once instead of after its data arrived,
// and counts it against limits.uploadsPerLocation.
func (s *Server) claim(loc, name string) (release func(), err error) {
	key := loc + "/" + name
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight[key] {
		return nil, status.Errorf(codes.AlreadyExists,
			"an upload of backup %q to location %q is already in progress; backups are immutable, choose another name", name, loc)
	}
	if n := s.uploads[loc]; n >= s.limits.UploadsPerLocation {
		return nil, status.Errorf(codes.ResourceExhausted,
			"%d uploads to location %q are in progress, the most this server allows (limits.uploadsPerLocation); try again when one has finished", n, loc)
	}
	s.inflight[key] = true
	s.uploads[loc]++
	return func() {
		s.mu.Lock()
		delete(s.inflight, key)
		if s.uploads[loc]--; s.uploads[loc] == 0 {
			delete(s.uploads, loc)
		}
		s.mu.Unlock()
	}, nil
}

// caller names who made a call, for the log: the user strict mode
// authenticated, the agent's Job, or "port-forward" (PortForward mode
// knows only that the caller could port-forward).
func caller(ctx context.Context) string {
	if u, ok := auth.UserFrom(ctx); ok {
		return "user " + u.Username
	}
	if a, ok := auth.AgentFrom(ctx); ok {
		return a.String()
	}
	return "port-forward"
}
