package auth

import (
	"context"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	grpcauth "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A Guard admits a call to fullMethod ("/package.Service/Method") or
// refuses it with a gRPC status (Unauthenticated, PermissionDenied) whose
// message says what was missing. The returned context is what the handler
// runs with: a Guard may attach what it learned about the caller.
type Guard interface {
	Admit(ctx context.Context, fullMethod string) (context.Context, error)
}

// AllowAll admits every call: the user listener in PortForward mode, where
// reaching the pod's loopback already took RBAC `create pods/portforward`.
type AllowAll struct{}

// Admit implements Guard.
func (AllowAll) Admit(ctx context.Context, _ string) (context.Context, error) { return ctx, nil }

// HealthService is grpc.health.v1's service: admitted by every Guard,
// because the kubelet's probes carry no credentials and health says
// nothing about backups.
const HealthService = "/grpc.health.v1.Health/"

// AuthFunc runs g as go-grpc-middleware's auth interceptors run an
// AuthFunc: on every call Guarded selects, before its handler, which
// gets the context g returns. The method is the one gRPC serves
// (grpc.Method).
func AuthFunc(g Guard) grpcauth.AuthFunc {
	return func(ctx context.Context) (context.Context, error) {
		method, _ := grpc.Method(ctx)
		return g.Admit(ctx, method)
	}
}

// Guarded selects the calls a Guard decides on: all but HealthService's.
// A server chains it with AuthFunc:
//
//	selector.UnaryServerInterceptor(grpcauth.UnaryServerInterceptor(auth.AuthFunc(g)), auth.Guarded)
var Guarded = selector.MatchFunc(func(ctx context.Context, _ interceptors.CallMeta) bool {
	method, _ := grpc.Method(ctx)
	return !strings.HasPrefix(method, HealthService)
})

// AuthorizationHeader is the gRPC metadata key that carries a bearer
// token, as HTTP's Authorization header does.
const AuthorizationHeader = "authorization"

// BearerToken returns the bearer token in ctx's incoming metadata, or
// Unauthenticated saying what is missing. The token never appears in an
// error.
func BearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(AuthorizationHeader)
	if len(vals) == 0 {
		return "", status.Error(codes.Unauthenticated, "the call carries no bearer token")
	}
	if len(vals) > 1 {
		return "", status.Error(codes.Unauthenticated, "the call carries more than one authorization header")
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return "", status.Error(codes.Unauthenticated, `the authorization header is not "Bearer TOKEN"`)
	}
	return strings.TrimSpace(token), nil
}
