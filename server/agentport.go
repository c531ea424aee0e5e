package server

import (
	"net"
	"time"

	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Bounds of the network-facing listeners (the agent port, the health
// port): whoever reaches the pod can open connections and send headers
// before any token is looked at. admission.go bounds what they can send
// after the headers.
const (
	// AgentMaxHeaderListSize bounds a call's headers (gRPC's default is
	// 16 MiB per stream): an agent's projected token is 1–2 KB.
	AgentMaxHeaderListSize = 16 << 10
	// AgentMaxConnections are served at once; more wait in the kernel's
	// backlog. Each agent holds one.
	AgentMaxConnections = 128
	// AgentMaxConnectionIdle closes a connection without calls for this
	// long (agents' gRPC reconnects on its next call). A call the guard
	// refuses ends at once, so a caller without a valid token cannot keep
	// a connection from being idle.
	AgentMaxConnectionIdle = 30 * time.Second
	// AgentConnectionTimeout bounds a connection's TLS handshake and
	// HTTP/2 preface.
	AgentConnectionTimeout = 10 * time.Second
	// healthMaxConnections bounds the health port (the kubelet's probes).
	healthMaxConnections = 32
)

// agentServerOptions are the agent listener's own: TLS when configured,
// the header bound, the idle timeout and what admission.go sets out.
//
// There is no MaxConnectionAge: at that age gRPC sends GOAWAY and closes
// the connection after the grace whatever its streams, and an upload of
// a large snapshot, or a delta agent's, runs for many minutes. Nothing
// unauthenticated keeps a connection busy (agentTap, guardFirst): idle,
// it closes after AgentMaxConnectionIdle.
func (s *Server) agentServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxHeaderListSize(AgentMaxHeaderListSize),
		grpc.ConnectionTimeout(AgentConnectionTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: AgentMaxConnectionIdle}),
		grpc.MaxConcurrentStreams(min(s.limits.MaxConcurrentStreams, AgentMaxConcurrentStreams)),
		grpc.StaticStreamWindowSize(agentStreamWindow),
		grpc.StaticConnWindowSize(agentConnWindow),
	}
	if t := agentTap(s.agentGuard); t != nil {
		opts = append(opts, grpc.InTapHandle(t))
	}
	if s.agentTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.agentTLS)))
	}
	return opts
}

// newAgentServer serves the agent port: the user port's services and
// interceptors with agentServerOptions, every method registered so the
// guard answers before a request is read (registerGuardFirst).
func (s *Server) newAgentServer() *grpc.Server {
	g := grpc.NewServer(append(s.grpcServerOptions(s.agentGuard), s.agentServerOptions()...)...)
	s.registerGuardFirst(g)
	return g
}

// limitAgentListener bounds the connections the agent listener serves,
// from one source address and in all.
func (s *Server) limitAgentListener(l net.Listener) net.Listener {
	return netutil.LimitListener(limitPerSource(l, AgentMaxConnectionsPerSource, s.connectionRefused("agent", AgentMaxConnectionsPerSource)), AgentMaxConnections)
}

// limitHealthListener bounds the health listener's connections likewise.
func (s *Server) limitHealthListener(l net.Listener) net.Listener {
	return netutil.LimitListener(limitPerSource(l, HealthMaxConnectionsPerSource, s.connectionRefused("health", HealthMaxConnectionsPerSource)), healthMaxConnections)
}

// connectionRefused counts a connection to port closed because its
// source held max already, and says so in the log at most once a minute
// per port: a flood must not flood the log too.
func (s *Server) connectionRefused(port string, max int) func(src string) {
	every := rate.Sometimes{Interval: time.Minute}
	return func(src string) {
		if s.metrics != nil {
			s.metrics.ConnectionsRefused.WithLabelValues(port).Inc()
		}
		every.Do(func() {
			s.log.Warn("connections refused: their source holds its share of the port already (further refusals this minute are only counted, etcdbackup_connections_refused_total)",
				"port", port, "source", src, "perSource", max)
		})
	}
}

// newHealthServer serves grpc.health.v1 Check alone, in plaintext, for
// the kubelet's gRPC probes (which speak neither TLS nor tokens).
func (s *Server) newHealthServer() *grpc.Server {
	g := grpc.NewServer(
		grpc.MaxHeaderListSize(AgentMaxHeaderListSize),
		grpc.MaxConcurrentStreams(4),
		grpc.MaxRecvMsgSize(healthMaxRecvMsgSize),
		grpc.StaticStreamWindowSize(healthWindow),
		grpc.StaticConnWindowSize(healthWindow),
		grpc.ConnectionTimeout(AgentConnectionTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     AgentMaxConnectionIdle,
			MaxConnectionAge:      HealthMaxConnectionAge,
			MaxConnectionAgeGrace: HealthMaxConnectionAgeGrace,
		}),
	)
	healthpb.RegisterHealthServer(g, checkOnly{s.health})
	return g
}

// checkOnly is the health service without Watch, whose stream never ends
// and which no probe uses: every listener serves Check only.
type checkOnly struct{ *health.Server }

// Watch implements healthpb.HealthServer by refusing.
func (checkOnly) Watch(*healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
	return status.Error(codes.Unimplemented, "health Watch is not served; use Check")
}
