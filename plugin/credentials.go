package plugin

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"
)

// kubeconfigToken sends the kubeconfig user's bearer token with every
// call, so that a server in SubjectAccessReview mode can tell who calls.
// The token comes out of client-go's own transport wrappers, run on a
// request that never leaves the process: whatever sets the API server's
// Authorization header (a static token, a token file re-read as it
// rotates, an exec credential plugin, an OIDC or other auth provider)
// sets this one, and client-go's caches decide when an exec plugin runs
// again or a token is refreshed, as they do for kubectl itself.
type kubeconfigToken struct {
	rt http.RoundTripper
}

var _ credentials.PerRPCCredentials = (*kubeconfigToken)(nil)

func newKubeconfigToken(cfg *rest.Config) (*kubeconfigToken, error) {
	rt, err := rest.HTTPWrappersForConfig(cfg, captureAuthorization{})
	if err != nil {
		return nil, fmt.Errorf("kubeconfig credentials: %w", err)
	}
	return &kubeconfigToken{rt: rt}, nil
}

// GetRequestMetadata implements credentials.PerRPCCredentials: the
// Authorization header client-go would send to the API server, when it is
// a bearer token. A user authenticated by a client certificate (or basic
// auth) has none, and the call goes without.
func (k *kubeconfigToken) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://kubeconfig.invalid/", nil)
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "kubeconfig credentials: %v", err)
	}
	resp, err := k.rt.RoundTrip(req)
	if err != nil {
		// An exec plugin that failed says why; its output is not a token.
		return nil, status.Errorf(codes.Unauthenticated, "cannot get the kubeconfig user's credentials: %v", err)
	}
	resp.Body.Close()
	h := resp.Header.Get("Authorization")
	if scheme, token, ok := strings.Cut(h, " "); !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return nil, nil
	}
	return map[string]string{"authorization": h}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. The
// tunnel is a port-forward stream inside the API server's TLS connection,
// so the token is encrypted on the wire although gRPC sees plain TCP.
func (*kubeconfigToken) RequireTransportSecurity() bool { return false }

// captureAuthorization is the innermost round tripper: it answers every
// request itself, echoing the Authorization header the wrappers set, so
// that concurrent calls never share state.
type captureAuthorization struct{}

func (captureAuthorization) RoundTrip(req *http.Request) (*http.Response, error) {
	h := http.Header{}
	if a := req.Header.Get("Authorization"); a != "" {
		h.Set("Authorization", a)
	}
	return &http.Response{StatusCode: http.StatusOK, Header: h, Body: http.NoBody, Request: req}, nil
}

// staticToken sends one bearer token with every call: --token given with
// --server-address. A direct connection carries no kubeconfig token
// unless asked to, because it is plain TCP to wherever the address
// points.
type staticToken string

func (t staticToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: the
// user asked for this token to be sent to this address.
func (staticToken) RequireTransportSecurity() bool { return false }
