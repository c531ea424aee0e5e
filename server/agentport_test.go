package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes/fake"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/agenttls"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// countingGuard refuses every call and counts those that reached it.
type countingGuard struct{ calls atomic.Int64 }

func (g *countingGuard) Admit(context.Context, string) (context.Context, error) {
	g.calls.Add(1)
	return nil, status.Error(codes.Unauthenticated, "counted")
}

const agentNS = "etcdbackup-system"

// tlsAgentServer serves the agent port over TLS with a CA of its own and
// returns the CA certificate's file.
func tlsAgentServer(t *testing.T, g *countingGuard) (*servertest.Server, string) {
	t.Helper()
	ca, err := agenttls.EnsureCA(context.Background(), fake.NewClientset(), agentNS, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServingCert(agenttls.ServerNames(agentNS), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	creds, err := client.WithServerCA(file, "etcdbackup."+agentNS+".svc")
	if err != nil {
		t.Fatal(err)
	}
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: g, AgentTLS: agenttls.ServerConfig(cert), AgentDialOptions: []grpc.DialOption{creds}, Health: true})
	return srv, file
}

// Agents reach the agent port over TLS, verifying the server with the
// CA for the Service's name; a client trusting another CA, expecting
// another name, or speaking plaintext never reaches the guard.
func TestAgentPortTLS(t *testing.T) {
	g := &countingGuard{}
	srv, caFile := tlsAgentServer(t, g)
	_, otherCAFile := tlsAgentServer(t, &countingGuard{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := srv.AgentClient.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{}); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "counted") {
		t.Fatalf("over TLS with the CA: %v; want the guard's answer", err)
	}
	withCA := func(file, name string) []grpc.DialOption {
		o, err := client.WithServerCA(file, name)
		if err != nil {
			t.Fatal(err)
		}
		return []grpc.DialOption{o}
	}
	for _, tc := range []struct {
		name string
		opts []grpc.DialOption
		want string
	}{
		{"another CA", withCA(otherCAFile, "etcdbackup."+agentNS+".svc"), "certificate"},
		{"another name", withCA(caFile, "intruder.example"), "certificate"},
		{"plaintext", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, c, err := client.Dial(srv.AgentAddr, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err = c.Info.GetServerInfo(cctx, &ebv1.GetServerInfoRequest{})
			if err == nil || strings.Contains(err.Error(), "counted") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v; want the connection refused (%q)", err, tc.want)
			}
		})
	}
	if n := g.calls.Load(); n != 1 {
		t.Fatalf("%d calls reached the guard; want 1", n)
	}
}

// A call's headers are bounded (gRPC's default allows 16 MiB): a token
// far beyond any real one never reaches the guard.
func TestAgentPortHeaderLimit(t *testing.T) {
	g := &countingGuard{}
	srv, _ := tlsAgentServer(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(size int) error {
		md := metadata.Pairs("authorization", "Bearer "+strings.Repeat("a", size))
		_, err := srv.AgentClient.Info.GetServerInfo(metadata.NewOutgoingContext(ctx, md), &ebv1.GetServerInfoRequest{})
		return err
	}
	// A real projected token is 1–2 KB.
	if err := call(2 << 10); !strings.Contains(fmtErr(err), "counted") {
		t.Fatalf("a 2 KiB token: %v; want it to reach the guard", err)
	}
	if err := call(server.AgentMaxHeaderListSize); err == nil || strings.Contains(err.Error(), "counted") {
		t.Fatalf("a %d-byte header: %v; want it refused before the guard", server.AgentMaxHeaderListSize, err)
	}
	if err := call(1 << 20); err == nil || strings.Contains(err.Error(), "counted") {
		t.Fatalf("a 1 MiB header: %v; want it refused before the guard", err)
	}
	if n := g.calls.Load(); n != 1 {
		t.Fatalf("%d calls reached the guard; want 1", n)
	}
	// The connection still serves.
	if err := call(100); !strings.Contains(fmtErr(err), "counted") {
		t.Fatalf("after the refusals: %v", err)
	}
}

// Health is Check only, on every listener: Watch, whose stream never
// ends, is refused; the health port speaks plaintext for the kubelet.
func TestHealthServesCheckOnly(t *testing.T) {
	srv, _ := tlsAgentServer(t, &countingGuard{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hconn, err := grpc.NewClient("passthrough:///"+srv.HealthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	for name, conn := range map[string]*grpc.ClientConn{"health port": hconn, "agent port": srv.AgentConn, "user port": srv.Conn} {
		h := healthpb.NewHealthClient(conn)
		r, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%s: Check: %v %v", name, r, err)
		}
		w, err := h.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("%s: Watch: %v; want Unimplemented", name, err)
		}
	}
	// The health port serves nothing else.
	_, err = ebv1.NewInfoServiceClient(hconn).GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("GetServerInfo on the health port: %v", err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
