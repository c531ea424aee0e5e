// Package server wires the data server together: it checks the
// configuration, builds the request handlers (server/rpc) and the
// background controller (server/controller) over one set of locations
// (server/domain), one starter of agent work (server/work), shared
// metrics and retention, and serves them — the user and agent listeners, health,
// recovery and authorization interceptors, the controller's goroutine
// (on the replica server/leader elects), the drain at shutdown.
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation/field"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/controller"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/coord"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/copies"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/leader"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
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
	// Agents launches the agents (backup, restore, drill, delta, fold);
	// nil refuses what needs one (CreateBackup, restores, drills) and
	// leaves the controller nothing to do.
	Agents *jobs.Launcher
	// ScratchDir holds temporary files of VerifyBackup; "" is os.TempDir().
	ScratchDir string
	// UserGuard admits calls on the user listener; nil admits every call
	// (PortForward mode: the listener is the pod's loopback).
	UserGuard auth.Guard
	// AgentGuard admits calls on the agent listener; nil refuses every
	// call there, since agents could not be told apart from anyone else.
	AgentGuard auth.Guard
	// DeltaFence admits delta segments (rpc.Config.DeltaFence); nil is
	// Agents' Lease check.
	DeltaFence rpc.DeltaFence
	// AgentTLS secures the agent listener (server/agenttls); nil serves
	// it in plaintext.
	AgentTLS *tls.Config
	// Limits bound what clients can make the server hold; zero fields
	// take their defaults (config.Limits.WithDefaults).
	Limits config.Limits
	// Leader elects the replica that runs the controller; nil runs it
	// here without an election (no Kubernetes API, or nothing for the
	// controller to do).
	Leader *leader.Elector
	// Coordination is what the replicas agree on: upload names, backups
	// being sent or removed (server/coord); nil is coord.NewLocal, right
	// for one replica. A registry with a Run method runs while Serve does.
	Coordination coord.Registry
	// HandOffDownloads makes Serve end the downloads in flight when it
	// shuts down (readpath.Service.HandOffDownloads), for their clients to
	// resume on another replica at once; set it when several run.
	HandOffDownloads bool
	// PollInterval is how often the controller's rounds look at agent
	// Jobs, storage and the schedules when no scheduled time comes
	// sooner; 0 means controller.DefaultPollInterval.
	PollInterval time.Duration
	// CheckLocations makes Serve check every available location once, in
	// the background, logging each failed step as a warning with its
	// advice (rpc.Service.CheckLocations); readiness does not wait for it.
	// The server binary sets it; tests that look at a location's files
	// leave it off.
	CheckLocations bool
}

// Listeners are where a Server serves.
type Listeners struct {
	// Users is the plugin's API: bind it to the pod's loopback, where the
	// kubelet delivers port-forward connections, never to the pod IP.
	Users net.Listener
	// Agents is the agents' API, the only port of the Service; nil
	// serves none.
	Agents net.Listener
	// Health serves grpc.health.v1 Check alone, in plaintext, for the
	// kubelet's probes; nil serves none.
	Health net.Listener
}

// Server is the data server: the etcdbackup.v1 handlers, the background
// controller, and what serves them.
type Server struct {
	// Service is the handlers, embedded so that a Server implements the
	// etcdbackup.v1 services itself (tests call it directly).
	*rpc.Service

	controller *controller.Controller
	// copier copies each location to its copy locations, on the replica
	// that runs the controller.
	copier     *copies.Copier
	leader     *leader.Elector
	coord      coord.Registry
	handOff    bool
	checkLocs  bool
	metrics    *metrics.Metrics
	health     *health.Server
	log        *slog.Logger
	limits     config.Limits
	userGuard  auth.Guard
	agentGuard auth.Guard
	agentTLS   *tls.Config
}

// New checks the configuration and returns a Server.
func New(cfg Config) (*Server, error) {
	if len(cfg.Locations) == 0 {
		return nil, errors.New("at least one storage location is required")
	}
	var names []string
	for _, l := range cfg.Locations {
		names = append(names, l.Name)
	}
	errs := storage.ValidateLocationNames(names, field.NewPath("locations"))
	errs = append(errs, config.ValidateTargets(cfg.Targets, names, field.NewPath("targets"))...)
	errs = append(errs, config.ValidateLimits(cfg.Limits, field.NewPath("limits"))...)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	log := cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	m, err := metrics.New(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	// The one set of locations, every call to them counted, for the
	// handlers, the controller and retention alike.
	locs, err := domain.NewLocations(cfg.Locations, m)
	if err != nil {
		return nil, err
	}
	starter := work.New(locs, cfg.Targets, cfg.Agents, log, now)
	reg := cfg.Coordination
	if reg == nil {
		reg = coord.NewLocal()
	}
	inUse := retention.NewInUse(cfg.Agents, cfg.Targets, reg)
	pruner := &retention.Pruner{InUse: inUse, Metrics: m, Log: log, Now: now}
	s := &Server{
		leader:     cfg.Leader,
		coord:      reg,
		handOff:    cfg.HandOffDownloads,
		checkLocs:  cfg.CheckLocations,
		metrics:    m,
		health:     health.NewServer(),
		log:        log,
		limits:     cfg.Limits.WithDefaults(),
		userGuard:  cfg.UserGuard,
		agentGuard: cfg.AgentGuard,
		agentTLS:   cfg.AgentTLS,
	}
	if s.userGuard == nil {
		s.userGuard = auth.AllowAll{}
	}
	if s.agentGuard == nil {
		s.agentGuard = refuseAll{}
	}
	s.copier = copies.New(copies.Config{
		Locations: locs, Targets: cfg.Targets, Pruner: pruner, Metrics: m, Logger: log, Now: now, Interval: cfg.PollInterval,
	})
	s.Service = rpc.New(rpc.Config{
		Locations: locs, Logger: log, Now: now, Metrics: m,
		Targets: cfg.Targets, Agents: cfg.Agents, Work: starter, ScratchDir: cfg.ScratchDir, Limits: s.limits,
		Coordination: reg, InUse: inUse, Pruner: pruner, DeltaFence: cfg.DeltaFence, Copies: s.copier,
	})
	s.controller = controller.New(controller.Config{
		Locations: locs, Targets: cfg.Targets, Agents: cfg.Agents, Metrics: m, Pruner: pruner,
		Work: starter, Logger: log, Now: now, PollInterval: cfg.PollInterval,
	})
	return s, nil
}

// register adds the etcdbackup and grpc.health.v1 services to g, which
// must have GRPCServerOptions (downloads need its codec).
func (s *Server) register(g *grpc.Server) {
	s.Register(g)
	healthpb.RegisterHealthServer(g, checkOnly{s.health})
	// SERVING even while a storage location is unavailable: a failing
	// readiness probe would take the server out of its Service, cutting
	// agents off from the locations that work, and a restart cannot bring
	// back a remote store; the location reports itself in
	// GetServerInfo and in the errors of calls to it instead.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ebv1.BackupService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// GRPCServerOptions are the options the server's streams need: the
// handlers' (rpc.ServerOptions) and keepalive.
func GRPCServerOptions() []grpc.ServerOption {
	return append(rpc.ServerOptions(),
		// Clients ping every 20 s to notice a dead port-forward tunnel;
		// the default policy would answer that with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
}

// refuseAll is the agent listener's guard when the server cannot
// authenticate agents (it runs without a Kubernetes client).
type refuseAll struct{}

func (refuseAll) Admit(context.Context, string) (context.Context, error) {
	return nil, status.Error(codes.Unauthenticated, "this server cannot authenticate agents: it runs without access to the Kubernetes API")
}

// NewGRPCServer returns a gRPC server with the etcdbackup and health
// services whose calls g admits.
func (s *Server) NewGRPCServer(g auth.Guard, extra ...grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(append(s.grpcServerOptions(g), extra...)...)
	s.register(srv)
	return srv
}

// grpcServerOptions are a server's whose calls g admits: the streams'
// (GRPCServerOptions), the stream bound, recovery and the guard.
func (s *Server) grpcServerOptions(g auth.Guard) []grpc.ServerOption {
	onPanic := recovery.WithRecoveryHandlerContext(s.recovered)
	admit := auth.AuthFunc(g)
	return append(GRPCServerOptions(),
		grpc.MaxConcurrentStreams(s.limits.MaxConcurrentStreams),
		// Recovery is outermost: a panic in the guard is caught too. The
		// guard decides on every call but health's (auth.Guarded). The
		// two chains must stay alike: the agent port serves its unary
		// methods through the stream chain alone (guardFirst).
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(onPanic),
			selector.UnaryServerInterceptor(grpcauth.UnaryServerInterceptor(admit), auth.Guarded)),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(onPanic),
			selector.StreamServerInterceptor(grpcauth.StreamServerInterceptor(admit), auth.Guarded)))
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
	return ebv1.ServerError(codes.Internal, "internal error; see the server log")
}

// runController runs the controller and the copier until ctx ends, its
// metric telling which replica runs them.
func (s *Server) runController(ctx context.Context) {
	s.metrics.ControllerLeader.Set(1)
	defer s.metrics.ControllerLeader.Set(0)
	var wg sync.WaitGroup
	wg.Go(func() { s.copier.Run(ctx) })
	s.controller.Run(ctx)
	wg.Wait()
}

// Serve serves ls until ctx is done, then stops accepting, reports
// NOT_SERVING to health checks, lets in-flight streams finish for up to
// drain, and stops. It returns when every listener has stopped.
func (s *Server) Serve(ctx context.Context, ls Listeners, drain time.Duration) error {
	servers := []*grpc.Server{s.NewGRPCServer(s.userGuard)}
	listeners := []net.Listener{ls.Users}
	if ls.Agents != nil {
		servers = append(servers, s.newAgentServer())
		listeners = append(listeners, s.limitAgentListener(ls.Agents))
	}
	if ls.Health != nil {
		servers = append(servers, s.newHealthServer())
		listeners = append(listeners, s.limitHealthListener(ls.Health))
	}
	errc := make(chan error, len(servers))
	for i, g := range servers {
		go func() { errc <- g.Serve(listeners[i]) }()
	}
	// The controller stops with Serve: with ctx, or when a listener
	// fails. With an election it runs only while this replica leads;
	// every replica serves.
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	if s.leader != nil {
		watch.Go(func() { s.leader.Run(watchCtx, s.runController) })
	} else {
		watch.Go(func() { s.runController(watchCtx) })
	}
	if r, ok := s.coord.(interface{ Run(context.Context) }); ok {
		watch.Go(func() { r.Run(watchCtx) })
	}
	if s.checkLocs {
		watch.Go(func() { s.CheckLocations(watchCtx) })
	}
	defer watch.Wait()
	defer stopWatch()
	var err error
	select {
	case err = <-errc:
		// One listener failed: stop the others too.
	case <-ctx.Done():
	}
	s.log.Info("shutting down: draining in-flight requests", "timeout", drain, "handOffDownloads", s.handOff)
	s.health.Shutdown()
	if s.handOff {
		s.HandOffDownloads()
	}
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
