// Command etcdbackup-server is the in-cluster data server: it holds the
// storage credentials and serves the etcdbackup.v1 gRPC API to the kubectl
// plugin (through a port-forward) and to the backup and restore agents.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/storage/filesystem"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "etcdbackup-server:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("etcdbackup-server", flag.ContinueOnError)
	listen := fs.String("listen", ":50051", "address the gRPC API listens on")
	storageDir := fs.String("storage-dir", "/var/lib/etcdbackup", "directory of the \"default\" filesystem storage location (mount a PersistentVolumeClaim here)")
	metricsListen := fs.String("metrics-listen", "", "address serving Prometheus /metrics (empty: off)")
	drain := fs.Duration("shutdown-timeout", 60*time.Second, "how long in-flight transfers may finish after SIGTERM")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Println(version.Version)
		return nil
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	loc, err := filesystem.New(*storageDir)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := server.New(server.Config{
		Locations:  []server.NamedLocation{{Name: "default", Location: loc}},
		Logger:     log,
		Registerer: reg,
	})
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	if *metricsListen != "" {
		m := &http.Server{Addr: *metricsListen, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := m.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", "error", err)
			}
		}()
		defer m.Close()
	}
	log.Info("serving", "version", version.Version, "listen", lis.Addr().String(), "storage", loc.Describe())
	return srv.Serve(ctx, lis, *drain)
}
