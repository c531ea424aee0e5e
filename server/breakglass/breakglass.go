// Package breakglass serves the read-only calls of the data server's API —
// server info, list, get, download, verify — from storage locations opened
// on the operator's own machine, with the operator's own credentials: the
// plugin's --storage-config, for the day the API server is down. It runs
// the server's own read path (server/rpc/readpath) over an in-process
// connection, so every check of the online path (stored SHA-256, etcd's
// trailer, decompression bound, age decryption, an unavailable location)
// holds, and it opens the locations read-only: nothing is written to
// them. It links nothing else of the server: no Jobs, authorization,
// controller or coordination.
package breakglass

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/test/bufconn"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/readpath"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/locations"
)

// configMapKey is where the etcdbackup-config ConfigMap keeps the
// server's configuration file (manifests/server.yaml).
const configMapKey = "config.yaml"

// Load reads the locations of a --storage-config file: the server's
// configuration file, or the etcdbackup-config ConfigMap that holds it,
// as `kubectl get configmap -o yaml` prints it. Only `locations:` is used;
// the rest of the server's keys are accepted and ignored, misspelled keys
// are errors, as the server treats them. Relative paths in a location
// (a directory, credential and CA files) are taken from the file's own
// directory, as kubeconfig does.
func Load(path string) ([]storage.LocationConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if b, err = unwrapConfigMap(b); err != nil {
		return nil, err
	}
	var f config.File
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("not the server's configuration (the etcdbackup-config ConfigMap's %s): %w", configMapKey, err)
	}
	if errs := storage.ValidateLocations(f.Locations, field.NewPath("locations")); len(errs) > 0 {
		return nil, fmt.Errorf("%w (copy the locations: of the server's etcdbackup-config ConfigMap, with credential files you hold)", errs.ToAggregate())
	}
	base, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	for i := range f.Locations {
		resolvePaths(&f.Locations[i], base)
	}
	return f.Locations, nil
}

// unwrapConfigMap returns the configuration file a ConfigMap holds, or b
// itself when it is not a ConfigMap.
func unwrapConfigMap(b []byte) ([]byte, error) {
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil || cm.Kind != "ConfigMap" {
		return b, nil
	}
	if c, ok := cm.Data[configMapKey]; ok {
		return []byte(c), nil
	}
	return nil, fmt.Errorf("a ConfigMap without the key %q, where the server's configuration is", configMapKey)
}

// resolvePaths makes l's relative paths relative to base.
func resolvePaths(l *storage.LocationConfig, base string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(base, *p)
		}
	}
	if fs := l.Filesystem; fs != nil {
		abs(&fs.Path)
	}
	if s3 := l.S3; s3 != nil {
		for _, p := range []*string{&s3.CABundleFile, &s3.AccessKeyIDFile, &s3.SecretAccessKeyFile, &s3.SessionTokenFile} {
			abs(p)
		}
	}
}

// drainTimeout bounds how long Stop lets a call still running finish.
const drainTimeout = 5 * time.Second

// Open loads file, opens its locations read-only and serves them in this
// process until stop is called or ctx ends. dial connects to that server
// (a gRPC client's context dialer). A location that cannot be opened does
// not fail Open: it is served as unavailable, as the data server does.
func Open(ctx context.Context, file string) (dial func(context.Context, string) (net.Conn, error), describe string, stop func(), err error) {
	cfgs, err := Load(file)
	if err != nil {
		return nil, "", nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	named, err := locations.Open(ctx, cfgs, locations.Options{ReadOnly: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		cancel()
		return nil, "", nil, err
	}
	locs, err := domain.NewLocations(named, nil)
	if err != nil {
		cancel()
		return nil, "", nil, err
	}
	// Every read is recorded in the location's ledger, where the
	// credentials may append to it: a break-glass read of every Secret
	// is not a quiet one.
	host, _ := os.Hostname()
	g := newServer(readpath.New(readpath.Config{Locations: locs, Limits: config.Limits{}.WithDefaults(), BreakGlass: "break-glass on " + cmp.Or(host, "an unnamed host")}))
	lis := bufconn.Listen(1 << 20)
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	stop = sync.OnceFunc(func() {
		cancel()
		drain(g, drainTimeout)
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			slog.Debug("break-glass server stopped", "error", err)
		}
	})
	dial = func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }
	return dial, "storage config " + file, stop, nil
}

// newServer is a gRPC server of rp alone, with what the data server's
// user port has that matters in-process: the streams' options, a panic
// in a handler made the server's INTERNAL error rather than the end of
// the plugin, and room for the client's keepalive pings.
func newServer(rp *readpath.Service) *grpc.Server {
	onPanic := recovery.WithRecoveryHandler(func(any) error {
		return ebv1.ServerError(codes.Internal, "internal error; see the server log")
	})
	g := grpc.NewServer(append(readpath.ServerOptions(),
		// Clients ping every 20 s; the default policy would answer that
		// with GOAWAY during a long download.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(onPanic)),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(onPanic)))...)
	rp.Register(g)
	return g
}

// drain lets calls in flight finish for up to d, then cancels them.
func drain(g *grpc.Server, d time.Duration) {
	stopped := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(d):
		g.Stop()
		<-stopped
	}
}
