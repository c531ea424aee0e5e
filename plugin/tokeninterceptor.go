package plugin

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// tokenWhenAsked sends the kubeconfig user's bearer token only to a
// server that asks for it. The token may be a cluster-admin's or an OIDC
// one good for every cluster the user reaches; a server in PortForward
// mode (the default) never uses it, and the pod it goes to is whichever
// Ready pod the Service's label selector picks. So the first call goes
// without: a server in SubjectAccessReview mode refuses it as
// Unauthenticated (the only mode that says so, and it says so before
// anything else), and the call is made again, once, with the token;
// every later call on the connection carries it at once. A server that
// admits a call without a token never gets it.
//
// Round trips: none more against a PortForward server whose first call
// is unary (list, get, version, ...). A stream cannot be sent again (an
// upload's data is gone), so before the first stream of a connection
// whose need is still unknown, one GetServerInfo finds it out. Against a
// SubjectAccessReview server the first call is made twice.
type tokenWhenAsked struct {
	creds credentials.PerRPCCredentials
	// need is needUnknown, needNone or needToken.
	need atomic.Int32
}

const (
	needUnknown int32 = iota
	needNone
	needToken
)

// dialOptions are the interceptors that do it.
func (p *tokenWhenAsked) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(p.unary), grpc.WithChainStreamInterceptor(p.stream)}
}

func (p *tokenWhenAsked) withToken(opts []grpc.CallOption) []grpc.CallOption {
	return append(opts[:len(opts):len(opts)], grpc.PerRPCCredentials(p.creds))
}

func (p *tokenWhenAsked) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if p.need.Load() == needToken {
		return invoker(ctx, method, req, reply, cc, p.withToken(opts)...)
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	switch {
	case status.Code(err) == codes.Unauthenticated:
		p.need.Store(needToken)
		return invoker(ctx, method, req, reply, cc, p.withToken(opts)...)
	case err == nil || admitted(err):
		p.need.CompareAndSwap(needUnknown, needNone)
	}
	return err
}

func (p *tokenWhenAsked) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if p.need.Load() == needUnknown {
		// Through the unary interceptor above, which learns the need.
		_ = cc.Invoke(ctx, ebv1.InfoService_GetServerInfo_FullMethodName, &ebv1.GetServerInfoRequest{}, &ebv1.GetServerInfoResponse{})
	}
	if p.need.Load() == needToken {
		opts = p.withToken(opts)
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// admitted says whether an error is a handler's answer, given after
// authorization: the call was admitted without a token.
func admitted(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.AlreadyExists, codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.DataLoss, codes.ResourceExhausted:
		return true
	}
	return false
}
