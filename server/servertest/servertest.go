// Package servertest runs a real data server — the request layer over
// filesystem locations in temporary directories, and any configured
// location — on a loopback TCP port, with a connected client, for tests
// of the server, the client, the agents and the plugin; with what those
// tests share around it: uploads and listings through the client, the
// checks of a refusal's status, a directory's tree (nothing changed on
// disk), and the restore world, a server over a fake cluster whose
// handlers restore tests call. Its package backuptest, which links no
// server, puts backups straight into a location.
package servertest

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// Server is a running data server.
type Server struct {
	// Addr is the loopback address it serves on.
	Addr string
	// Dir is the (first) filesystem location's root.
	Dir string
	// Dirs are the roots of every location, by name.
	Dirs   map[string]string
	Conn   *grpc.ClientConn
	Client *client.Client
	// AgentAddr, AgentConn and AgentClient are the agent listener's, when
	// Options.AgentGuard is set.
	AgentAddr   string
	AgentConn   *grpc.ClientConn
	AgentClient *client.Client
	// HealthAddr is the health listener's, when Options.Health is set.
	HealthAddr string
	stop       func()
}

// Options configure StartWith; the zero value is what Start serves.
type Options struct {
	// PollInterval is the controller's and the copier's round interval
	// (0: their defaults).
	PollInterval time.Duration
	// Locations names the filesystem locations, each in a temporary
	// directory of its own; the first is the default. Empty means one
	// location called "default".
	Locations []string
	// Targets and Agents let CreateBackup launch agents (with a fake
	// clientset in tests); see server.Config.
	Targets []config.Target
	Agents  *jobs.Launcher
	// UserGuard admits calls (server.Config.UserGuard); nil admits all.
	UserGuard auth.Guard
	// AgentGuard, when set, serves an agent listener too, whose calls it
	// admits (see server.Config.AgentGuard); AsAgent makes one that
	// admits every call as a given agent.
	AgentGuard auth.Guard
	// DeltaFence admits delta segments (server.Config.DeltaFence).
	DeltaFence rpc.DeltaFence
	// AgentDialOptions are added to the agent connection's, e.g. the
	// token an agent sends.
	AgentDialOptions []grpc.DialOption
	// AgentTLS, when set, secures the agent listener
	// (server.Config.AgentTLS); AgentDialOptions must then trust it.
	AgentTLS *tls.Config
	// Health, when set, serves the plaintext health listener too
	// (Server.HealthAddr).
	Health bool
	// Limits are the server's (server.Config.Limits); zero fields take
	// their defaults.
	Limits config.Limits
	// Configured are locations opened as the server binary opens them
	// (locations.Open, with LocationOptions), served after the filesystem
	// Locations: an S3 store (s3test), a location that is unavailable.
	// Their background retries end with the server.
	Configured      []storage.LocationConfig
	LocationOptions locations.Options
	// Logger receives the server's log; nil discards it.
	Logger *slog.Logger
	// HandOffDownloads ends downloads in flight at Stop
	// (server.Config.HandOffDownloads), as a replica among several does.
	HandOffDownloads bool
	// Dir, when set, is the first location's root instead of a new
	// temporary directory: several servers on one store, as replicas.
	Dir string
	// CheckLocations checks every location once Serve starts
	// (server.Config.CheckLocations); off, a location holds only what
	// the test puts there.
	CheckLocations bool
}

// AsAgent is a Guard that admits every call as the agent it is: for tests
// of what handlers allow an agent the real guard (auth.AgentGuard) admitted.
type AsAgent auth.Agent

// Admit implements auth.Guard.
func (a AsAgent) Admit(ctx context.Context, _ string) (context.Context, error) {
	agent := auth.Agent(a)
	return auth.WithAgent(ctx, &agent), nil
}

// Start serves a filesystem location rooted at dir (a new temporary
// directory when empty) until Stop or the end of the test.
func Start(t testing.TB, dir string) *Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	return start(t, Options{}, map[string]string{"default": dir})
}

// StartWith serves what opts describes until Stop or the end of the test.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	names := opts.Locations
	if len(names) == 0 {
		names = []string{"default"}
	}
	dirs := map[string]string{}
	for _, n := range names {
		dirs[n] = t.TempDir()
	}
	if opts.Dir != "" {
		dirs[names[0]] = opts.Dir
	}
	opts.Locations = names
	return start(t, opts, dirs)
}

func start(t testing.TB, opts Options, dirs map[string]string) *Server {
	t.Helper()
	names := opts.Locations
	if len(names) == 0 {
		names = []string{"default"}
	}
	cfg := server.Config{Targets: opts.Targets, Agents: opts.Agents, UserGuard: opts.UserGuard, AgentGuard: opts.AgentGuard, Limits: opts.Limits,
		Logger: opts.Logger, AgentTLS: opts.AgentTLS, DeltaFence: opts.DeltaFence, HandOffDownloads: opts.HandOffDownloads,
		CheckLocations: opts.CheckLocations, PollInterval: opts.PollInterval}
	for _, n := range names {
		loc, err := filesystem.New(dirs[n])
		if err != nil {
			t.Fatal(err)
		}
		cfg.Locations = append(cfg.Locations, server.NamedLocation{Name: n, Location: loc})
	}
	ctx, cancel := context.WithCancel(context.Background())
	if len(opts.Configured) > 0 {
		locs, err := locations.Open(ctx, opts.Configured, opts.LocationOptions)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		cfg.Locations = append(cfg.Locations, locs...)
	}
	srv, err := server.New(cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	ls := server.Listeners{Users: lis}
	if opts.AgentGuard != nil {
		if ls.Agents, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	if opts.Health {
		if ls.Health, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ls, 10*time.Second) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &Server{Addr: lis.Addr().String(), Dir: dirs[names[0]], Dirs: dirs, Conn: conn, Client: client.New(conn)}
	if ls.Health != nil {
		s.HealthAddr = ls.Health.Addr().String()
	}
	if ls.Agents != nil {
		s.AgentAddr = ls.Agents.Addr().String()
		if s.AgentConn, s.AgentClient, err = client.Dial(s.AgentAddr, opts.AgentDialOptions...); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			// A test that ends at once stops the server before Serve
			// started serving it: not a failure.
			if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				t.Errorf("Serve: %v", err)
			}
			conn.Close()
			if s.AgentConn != nil {
				s.AgentConn.Close()
			}
		})
	}
	t.Cleanup(s.stop)
	return s
}

// Stop shuts the server down (draining in-flight streams) and waits.
func (s *Server) Stop() { s.stop() }
