package client

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// WithServerCA is the DialOption for the server's agent port: TLS 1.3,
// the server's certificate verified against the CA certificates in file
// (the server's agent CA, which agent Jobs mount from ConfigMap
// etcdbackup-agent-ca) for serverName, or, if serverName is empty, for
// the host of the address dialled.
func WithServerCA(file, serverName string) (grpc.DialOption, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read the server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("server CA %s holds no PEM certificate", file)
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS13,
	})), nil
}
