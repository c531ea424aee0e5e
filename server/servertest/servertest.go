// Package servertest runs a real data server — the request layer over a
// filesystem location in a temporary directory — on a loopback TCP port,
// with a connected client, for tests of the server, the client and the
// agents.
package servertest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/filesystem"
)

// Server is a running data server.
type Server struct {
	// Addr is the loopback address it serves on.
	Addr string
	// Dir is the filesystem location's root.
	Dir    string
	Conn   *grpc.ClientConn
	Client *client.Client
	stop   func()
}

// Start serves a filesystem location rooted at dir (a new temporary
// directory when empty) until Stop or the end of the test.
func Start(t testing.TB, dir string) *Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	loc, err := filesystem.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, 10*time.Second) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &Server{Addr: lis.Addr().String(), Dir: dir, Conn: conn, Client: client.New(conn)}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
			conn.Close()
		})
	}
	t.Cleanup(s.stop)
	return s
}

// Stop shuts the server down (draining in-flight streams) and waits.
func (s *Server) Stop() { s.stop() }
