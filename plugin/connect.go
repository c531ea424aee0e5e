package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tunnel"
)

// errAlreadyReported is returned when a command printed its own errors.
var errAlreadyReported = errors.New("")

// IsAlreadyReported tells main not to print err again.
func IsAlreadyReported(err error) bool { return errors.Is(err, errAlreadyReported) }

// dialOptions are shared by direct and tunnelled connections. Keepalive
// pings notice a dead tunnel in seconds instead of at the next write;
// client.Reconnect finds a replaced server pod within seconds of it being
// Ready.
// Clipped: callers append their own options, concurrently (parallel
// downloads connect once per range).
var dialOptions = slices.Clip(append([]grpc.DialOption{
	grpc.WithTransportCredentials(insecure.NewCredentials()),
	client.Reconnect,
	grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
}, client.DialOptions...))

func (g *GlobalOptions) namespace() string {
	if g.ConfigFlags.Namespace != nil && *g.ConfigFlags.Namespace != "" {
		return *g.ConfigFlags.Namespace
	}
	return DefaultNamespace
}

// explicitToken is --token, when given: the only token a direct
// connection (--server-address) sends.
func (g *GlobalOptions) explicitToken() string {
	if g.ConfigFlags.BearerToken == nil {
		return ""
	}
	return *g.ConfigFlags.BearerToken
}

// connectTunnel resolves and dials the server once up front, so that a
// missing install, an unready pod or missing RBAC is reported as such
// rather than as a gRPC "connection error"; later (re-)dials by gRPC go
// through the same tunnel dialer.
func (g *GlobalOptions) connectTunnel(ctx context.Context, extra []grpc.DialOption) (*Connection, error) {
	ctx = traceHTTP(ctx)
	cfg, err := g.ConfigFlags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	trace("kubeconfig loaded")
	token, err := newKubeconfigToken(cfg)
	if err != nil {
		return nil, err
	}
	d, err := tunnel.New(cfg, tunnel.Target{Namespace: g.namespace(), Service: g.ServerService})
	if err != nil {
		return nil, err
	}
	d.Trace = traceFunc()
	usePodHint(d, g.podHintPath(cfg.Host))
	trace("API clients built")
	dctx, cancel := context.WithTimeout(ctx, g.ConnectTimeout)
	defer cancel()
	first, err := d.DialContext(dctx, "")
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("no answer from the API server within %s (--connect-timeout): %w", g.ConnectTimeout, err)
		}
		return nil, err
	}
	trace("tunnel open")
	var once sync.Once
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		once.Do(func() { c = traceNetConn(first) })
		if c != nil {
			return c, nil
		}
		return d.DialContext(ctx, addr)
	}
	target := first.(*tunnel.Conn).Endpoint().String()
	// The kubeconfig's token goes only to a server that asks for it.
	asked := &tokenWhenAsked{creds: token}
	conn, err := grpc.NewClient("passthrough:///"+g.ServerService+"."+g.namespace(),
		slices.Concat(dialOptions, []grpc.DialOption{grpc.WithContextDialer(dial)}, asked.dialOptions(), extra)...)
	if err != nil {
		first.Close()
		return nil, err
	}
	return &Connection{Client: client.New(conn), conn: conn, Target: target}, nil
}

// explain turns an RPC error into one that says what to do.
func (c *Connection) explain(op string, err error) error {
	if err == nil {
		return nil
	}
	var gaveUp *client.GiveUpError
	if errors.As(err, &gaveUp) {
		return withCode(codeExit(status.Code(gaveUp.Err)), fmt.Errorf("%s: cannot reach the etcdbackup server at %s: %s", op, c.Target, gaveUp.Detail()))
	}
	s, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	code := codeExit(s.Code())
	switch s.Code() {
	case codes.Unavailable:
		if ebv1.IsServerError(s) {
			// The server answered: one of its storage locations, or the
			// Kubernetes API it asks, did not.
			return withCode(code, fmt.Errorf("%s: %s", op, s.Message()))
		}
		return withCode(code, fmt.Errorf("%s: cannot reach the etcdbackup server at %s: %s", op, c.Target, s.Message()))
	case codes.Unimplemented:
		return withCode(code, fmt.Errorf("%s: the server at %s does not support this (%s); upgrade the server to the plugin's version", op, c.Target, s.Message()))
	}
	// The server's messages are written for people; the code is context.
	return withCode(code, fmt.Errorf("%s: %s (%s)", op, s.Message(), s.Code()))
}

func quote(s string) string { return strconv.Quote(s) }
