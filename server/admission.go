package server

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
)

// What a caller who reaches the agent or health port gets before any
// token is looked at. gRPC reads a unary call's request before any
// interceptor runs, and reading it opens the stream's flow-control window
// to the length the request declares: a call that declares 1 MiB, sends
// all of it but a byte and never the rest holds 1 MiB, and its
// connection is never idle. Three things bound that on the agent port:
//
//   - a tap (agentTap) refuses, from the headers alone, every call
//     without an "authorization: Bearer JWT" header: nothing of it is
//     read;
//   - every method is dispatched as a stream (guardFirst), so the guard
//     answers before gRPC reads anything of the request: a call it
//     refuses never gets past the stream's initial window;
//   - that window is static (agentStreamWindow): gRPC's dynamic windows
//     grow with the bandwidth a connection's own client shows it, so a
//     caller could grow them for the streams it holds before auth.
//
// What a caller can hold before auth is then at most agentStreamWindow
// per stream, AgentMaxConcurrentStreams streams per connection,
// AgentMaxConnectionsPerSource connections per source address and
// AgentMaxConnections in all: 8 MiB for one source, 64 MiB for the
// port. An admitted agent's call is read up to gRPC's MaxRecvMsgSize
// (rpc.ServerOptions: an upload chunk), whatever its method: gRPC has
// that bound per server, not per method.
//
// The health port serves the kubelet, which sends no token: its calls
// are tiny (healthMaxRecvMsgSize, refused from the declared length
// before anything is read), its windows static, and every connection
// ends after HealthMaxConnectionAge (plus grace), so a half-open Check
// holds a slot for seconds, not for ever.
const (
	// AgentMaxConcurrentStreams bounds the calls one agent connection
	// may have open (the server's limits.maxConcurrentStreams when
	// smaller). An agent makes a call or two at a time; more would wait
	// in its gRPC client for a free stream, not fail.
	AgentMaxConcurrentStreams = 8
	// AgentMaxConnectionsPerSource bounds the agent port's connections
	// from one IP address; more are closed as soon as they are
	// accepted. An agent holds one connection (two while it reconnects)
	// from its pod's IP; this leaves room for every agent of a node
	// behind one address (SNAT to the node's IP), and makes one
	// attacking pod hold at most an eighth of AgentMaxConnections.
	AgentMaxConnectionsPerSource = 16
	// agentStreamWindow is the agent port's HTTP/2 stream window, gRPC's
	// initial one. A read of a message opens it to the message's length,
	// so an upload's chunk streams whole; between chunks the agent waits
	// a round trip for the next read, where a grown window would let it
	// send ahead: nothing measurable inside a cluster's round trips.
	agentStreamWindow = 64 << 10
	// agentConnWindow is the agent port's connection window. gRPC gives
	// it back as data arrives, whether or not it is read, so it costs no
	// memory; it is the bytes an upload may have on the wire, beyond
	// any RTT × bandwidth inside a cluster.
	agentConnWindow = 4 << 20

	// HealthMaxConnectionsPerSource bounds the health port's connections
	// from one IP address. The kubelet dials one connection per probe
	// (startup, readiness, liveness) from the node's IP and closes it.
	HealthMaxConnectionsPerSource = 8
	// HealthMaxConnectionAge ends every health connection (GOAWAY, then
	// a close after HealthMaxConnectionAgeGrace): a probe takes well
	// under a second, a Check that never sends its request holds a slot
	// this long at most (gRPC adds up to 10 % of jitter).
	HealthMaxConnectionAge      = 10 * time.Second
	HealthMaxConnectionAgeGrace = 2 * time.Second
	// healthMaxRecvMsgSize bounds a Check request (a service name).
	healthMaxRecvMsgSize = 4 << 10
	// healthWindow is the health port's stream and connection window:
	// the least gRPC allows, and static (see agentStreamWindow).
	healthWindow = 64 << 10

	// maxBearerTokenBytes is the longest token agentTap lets through, as
	// auth.AgentGuard's: a projected ServiceAccount token is 1–2 KB.
	maxBearerTokenBytes = 8 << 10
)

// BearerGuard is a Guard that admits only calls whose "authorization:
// Bearer TOKEN" header carries a JWT, as auth.AgentGuard does: on the
// agent port, any other call is then refused before dispatch (agentTap).
// Serve treats auth.AgentGuard so without it.
type BearerGuard interface {
	auth.Guard
	// AdmitsOnlyBearerJWTs marks the guard; it is not called.
	AdmitsOnlyBearerJWTs()
}

// agentTap returns the agent port's InTapHandle for guard g, or nil when
// g may admit calls without a bearer token (a test's guard): the tap
// would refuse what g admits.
func agentTap(g auth.Guard) func(context.Context, *tap.Info) (context.Context, error) {
	switch g := g.(type) {
	case refuseAll:
		// Nothing would be admitted: nothing needs reading.
		return func(ctx context.Context, _ *tap.Info) (context.Context, error) {
			return g.Admit(ctx, "")
		}
	case *auth.AgentGuard, BearerGuard:
		return tapBearer
	}
	return nil
}

// healthPrefix is grpc.health.v1's methods'.
var healthPrefix = "/" + healthpb.Health_ServiceDesc.ServiceName + "/"

// tapBearer refuses a call from its headers: a health check (the guards
// let those through unread, auth.Guarded, and the kubelet probes the
// health port), or a call without a plausible bearer token. It runs on
// the connection's reading goroutine, before the call has a goroutine of
// its own: it must not block.
func tapBearer(ctx context.Context, info *tap.Info) (context.Context, error) {
	if strings.HasPrefix(info.FullMethodName, healthPrefix) {
		return nil, status.Error(codes.PermissionDenied, "the agent port serves no health checks; they are served on the health port")
	}
	if err := plausibleBearer(info.Header); err != nil {
		return nil, err
	}
	return ctx, nil
}

// plausibleBearer says whether md carries one "authorization: Bearer
// TOKEN" header whose token is shaped as a JWT (three base64url segments)
// of at most maxBearerTokenBytes: what any token auth.AgentGuard admits
// looks like, checked without decoding anything. The token never appears
// in the error.
func plausibleBearer(md metadata.MD) error {
	const want = `the agent port requires an "authorization: Bearer TOKEN" header carrying the agent pod's projected ServiceAccount token (a JWT)`
	vals := md.Get(auth.AuthorizationHeader)
	if len(vals) != 1 {
		return status.Error(codes.Unauthenticated, want)
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return status.Error(codes.Unauthenticated, want)
	}
	if len(token) > maxBearerTokenBytes {
		return status.Errorf(codes.Unauthenticated, "%s; this one is over %d bytes", want, maxBearerTokenBytes)
	}
	if !isJWTShaped(token) {
		return status.Errorf(codes.Unauthenticated, "%s; this one is not three base64url segments", want)
	}
	return nil
}

func isJWTShaped(token string) bool {
	segments := 1
	empty := true
	for i := 0; i < len(token); i++ {
		switch c := token[i]; {
		case c == '.':
			if empty {
				return false
			}
			segments++
			empty = true
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_', c == '=':
			empty = false
		default:
			return false
		}
	}
	return segments == 3 && !empty
}

// registerGuardFirst registers on g the services register does, each
// unary method as a stream: gRPC reads a unary call's request before its
// interceptors run, a stream's only when the handler asks, after the
// stream interceptors (recovery, the guard). Nothing else changes for
// the caller: the request is read with the same bounds (one message,
// then the end of the stream), the response is one message and the
// status.
func (s *Server) registerGuardFirst(g *grpc.Server) {
	r := guardFirst{g}
	// What rpc.Service.Register and register register;
	// TestAgentPortServesWhatTheUserPortServes keeps the lists alike.
	ebv1.RegisterInfoServiceServer(r, s)
	ebv1.RegisterBackupServiceServer(r, s)
	ebv1.RegisterAgentServiceServer(r, s)
	healthpb.RegisterHealthServer(r, checkOnly{s.health})
}

// guardFirst registers every unary method as a stream (registerGuardFirst).
type guardFirst struct{ *grpc.Server }

func (r guardFirst) RegisterService(sd *grpc.ServiceDesc, impl any) {
	d := *sd
	d.Methods = nil
	d.Streams = append([]grpc.StreamDesc(nil), sd.Streams...)
	for _, m := range sd.Methods {
		d.Streams = append(d.Streams, grpc.StreamDesc{
			StreamName: m.MethodName,
			Handler:    unaryAsStream(m.Handler),
			// gRPC skips the stream interceptors for a call that streams
			// neither way; ServerStreams only says so to the server (a
			// client's stub decides for itself), and one response is a
			// stream of one.
			ServerStreams: true,
		})
	}
	r.Server.RegisterService(&d, impl)
}

// unaryAsStream serves a unary method's handler from a stream. The
// stream interceptors have already run, so the unary ones are not
// passed: they are the same recovery and guard.
func unaryAsStream(h grpc.MethodHandler) grpc.StreamHandler {
	return func(srv any, ss grpc.ServerStream) error {
		reply, err := h(srv, ss.Context(), ss.RecvMsg, nil)
		if err != nil {
			return err
		}
		return ss.SendMsg(reply)
	}
}

// limitPerSource closes, as soon as they are accepted, l's connections
// from an IP address that already has max open; they never reach
// gRPC.
func limitPerSource(l net.Listener, max int, refused func(src string)) net.Listener {
	return &perSourceListener{Listener: l, max: max, open: map[string]int{}, refused: refused}
}

type perSourceListener struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[string]int
	// refused, if set, is told of each connection closed at once.
	refused func(src string)
}

func (l *perSourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		l.mu.Lock()
		if l.open[src] >= l.max {
			l.mu.Unlock()
			_ = c.Close()
			if l.refused != nil {
				l.refused(src)
			}
			continue
		}
		l.open[src]++
		l.mu.Unlock()
		return &sourceConn{Conn: c, release: func() { l.release(src) }}, nil
	}
}

func (l *perSourceListener) release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[src]--; l.open[src] <= 0 {
		delete(l.open, src)
	}
}

// sourceOf is the IP address a connection comes from (an IPv4 address
// the same whether or not it arrives mapped into IPv6).
func sourceOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap().String()
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap().String()
	}
	return a.String()
}

// sourceConn gives its source's slot back once, at its first Close:
// before the close, so that a client who sees its connection end finds
// the slot free.
type sourceConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *sourceConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
