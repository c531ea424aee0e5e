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
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
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
	storageDir := fs.String("storage-dir", "/var/lib/etcdbackup", "directory of the \"default\" filesystem storage location (mount a PersistentVolumeClaim here); ignored with --config")
	configFile := fs.String("config", "", "configuration file: storage locations, etcd targets, agents (see docs/design.md)")
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "the server's namespace, where agent Jobs run (default $POD_NAMESPACE)")
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

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	cfg := server.Config{Logger: log}
	// Without --config: one filesystem location, no targets.
	f := &config.File{Locations: []config.Location{{Name: "default", Filesystem: &config.Filesystem{Path: *storageDir}}}}
	var err error
	if *configFile != "" {
		if f, err = config.Load(*configFile); err != nil {
			return err
		}
	}
	if cfg.Locations, err = server.OpenLocations(ctx, f.Locations, log); err != nil {
		return err
	}
	cfg.Targets = f.Targets
	if f.Agents.Image != "" {
		if cfg.Agents, err = jobs.NewInCluster(*namespace, f.Agents); err != nil {
			return err
		}
	} else if len(cfg.Targets) > 0 {
		log.Warn("targets are configured but agents.image is not: on-demand backups are off")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}

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
	var where []string
	for _, l := range cfg.Locations {
		where = append(where, l.Name+"="+l.Location.Describe())
	}
	log.Info("serving", "version", version.Version, "listen", lis.Addr().String(), "locations", where)
	return srv.Serve(ctx, lis, *drain)
}
