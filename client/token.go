package client

import (
	"context"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TokenFile sends the bearer token in a file with every call, as
// "authorization: Bearer TOKEN". The file is read again for each call:
// the kubelet rotates a projected ServiceAccount token in place.
type TokenFile string

var _ credentials.PerRPCCredentials = TokenFile("")

// GetRequestMetadata implements credentials.PerRPCCredentials. Its errors
// name the file, never its content.
func (f TokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("read the agent's token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return nil, fmt.Errorf("token file %s is empty", f)
	}
	return map[string]string{"authorization": "Bearer " + token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. The
// agents reach the server over the cluster network in plaintext; the
// token is short-lived, bound to the agent's pod and good only for the
// server's audience.
func (TokenFile) RequireTransportSecurity() bool { return false }

// WithTokenFile is the DialOption that sends f's token with every call.
func WithTokenFile(f string) grpc.DialOption { return grpc.WithPerRPCCredentials(TokenFile(f)) }
