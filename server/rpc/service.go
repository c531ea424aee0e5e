// Package rpc is the data server's request layer: the handlers of the
// etcdbackup.v1 services, which validate each request, resolve its
// storage location and etcd target, enforce limits and integrity (sizes
// and SHA-256) and answer with status codes a client can act on.
// Requests reach storage only through storage.Location.
package rpc

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/coord"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

const (
	// MaxChunkBytes is the largest chunk accepted or sent on a stream. It
	// bounds the memory a stream holds, whatever the backup's size.
	MaxChunkBytes = 1 << 20
	// MaxNameLength keeps NAME.json within the 255-byte file-name limit of
	// common file systems; S3 keys allow more, names must work everywhere.
	MaxNameLength = 200
	// downloadChunkBytes is what the server sends per message: just under
	// gRPC's 1 MiB pooled buffer size, so each message takes one buffer
	// (a 256 KiB message would take, and zero, a 1 MiB buffer anyway).
	downloadChunkBytes = 1<<20 - 64
)

// Config is what a Service needs. server.New checks it (location names,
// targets, limits) before it builds one.
type Config struct {
	// Locations are the server's storage locations (server.New builds
	// them once, for the controller too).
	Locations *domain.Locations
	// Logger nil logs nothing; Now nil is time.Now.
	Logger  *slog.Logger
	Now     func() time.Time
	Metrics *metrics.Metrics
	// Targets are the etcd clusters CreateBackup can back up; the first
	// is the default.
	Targets []config.Target
	// Agents launches backup and restore agents; nil refuses both.
	Agents *jobs.Launcher
	// Work starts backups and drills (shared with the controller); nil
	// is one over Locations, Targets and Agents.
	Work *work.Starter
	// ScratchDir holds temporary files of VerifyBackup; "" is os.TempDir().
	ScratchDir string
	// Limits, with their defaults (config.Limits.WithDefaults).
	Limits config.Limits
	// Coordination claims upload names where every replica sees them;
	// nil is coord.NewLocal (this replica alone). server.New gives InUse
	// the same registry, so that one replica's claims live in one place.
	Coordination coord.Registry
	// InUse and Pruner are retention's, shared with the controller.
	InUse  *retention.InUse
	Pruner *retention.Pruner
	// DeltaFence admits delta segments; nil stores none.
	DeltaFence DeltaFence
	// DeltaLeases holds delta agents' Leases for them; nil is Agents.
	DeltaLeases DeltaLeases
}

// Service implements the etcdbackup.v1 services.
type Service struct {
	ebv1.UnimplementedInfoServiceServer
	ebv1.UnimplementedBackupServiceServer
	ebv1.UnimplementedAgentServiceServer

	locations *domain.Locations
	log       *slog.Logger
	now       func() time.Time
	metrics   *metrics.Metrics

	targets    domain.Targets
	agents     *jobs.Launcher
	work       *work.Starter
	scratchDir string
	limits     config.Limits
	// verifies bounds what VerifyBackup unpacks into scratchDir at once;
	// its zero value has the defaults.
	verifies verifyGate

	uploads    claims
	coord      coord.Registry
	chains     chains
	deltaFence DeltaFence
	// deltaLeases is Config.DeltaLeases; leaseLimits bound each delta
	// agent pod's calls of it.
	deltaLeases DeltaLeases
	leaseLimits leaseLimits
	inUse       *retention.InUse
	pruner      *retention.Pruner
	// handoff, closed by HandOffDownloads, ends the downloads in flight
	// and those that start after.
	handoff     chan struct{}
	handoffOnce sync.Once
}

// HandOffDownloads ends every download in flight, and every one that
// starts later, with Unavailable, so that their clients resume them at
// once on another replica instead of waiting for this one to drain: for
// a replica that is shutting down while others serve. Uploads are left
// to finish.
func (s *Service) HandOffDownloads() {
	s.handoffOnce.Do(func() { close(s.handoff) })
}

// New returns the Service cfg describes.
func New(cfg Config) *Service {
	s := &Service{
		locations:   cfg.Locations,
		log:         cfg.Logger,
		now:         cfg.Now,
		metrics:     cfg.Metrics,
		targets:     cfg.Targets,
		agents:      cfg.Agents,
		work:        cfg.Work,
		scratchDir:  cfg.ScratchDir,
		limits:      cfg.Limits,
		uploads:     claims{perLocation: map[string]int{}},
		coord:       cfg.Coordination,
		handoff:     make(chan struct{}),
		inUse:       cfg.InUse,
		pruner:      cfg.Pruner,
		deltaFence:  cfg.DeltaFence,
		deltaLeases: cfg.DeltaLeases,
		verifies:    verifyGate{budget: cfg.Limits.VerifyScratchBytes},
	}
	if s.deltaFence == nil && cfg.Agents != nil {
		s.deltaFence = cfg.Agents
	}
	if s.deltaLeases == nil && cfg.Agents != nil {
		s.deltaLeases = cfg.Agents
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.coord == nil {
		s.coord = coord.NewLocal()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.work == nil {
		s.work = work.New(cfg.Locations, cfg.Targets, cfg.Agents, s.log, s.now)
	}
	return s
}

// Register adds the etcdbackup.v1 services to g, which must have
// ServerOptions (downloads need its codec).
func (s *Service) Register(g *grpc.Server) {
	ebv1.RegisterInfoServiceServer(g, s)
	ebv1.RegisterBackupServiceServer(g, s)
	ebv1.RegisterAgentServiceServer(g, s)
}

// location resolves a request's location name ("" is the default), or
// refuses it: not configured, or unavailable now.
func (s *Service) location(name string) (string, storage.Location, error) {
	l, err := s.locations.Get(name)
	if err != nil {
		return "", nil, statusOf("", err)
	}
	return l.Name, l, nil
}

// target resolves a request's target name ("" is the default).
func (s *Service) target(name string) (*config.Target, error) {
	t, err := s.targets.Get(name)
	if err != nil {
		return nil, statusOf("", err)
	}
	return t, nil
}

// caller names who made a call, for the log: the user strict mode
// authenticated, the agent's Job, or "port-forward" (PortForward mode
// knows only that the caller could port-forward).
func caller(ctx context.Context) string {
	if u, ok := auth.UserFrom(ctx); ok {
		return "user " + u.Username
	}
	if a, ok := auth.AgentFrom(ctx); ok {
		return a.String()
	}
	return "port-forward"
}

// agentMay holds an agent to the one backup its Job was created for.
func agentMay(a *auth.Agent, kind, verb, name, location string) error {
	if a.Kind != kind {
		return status.Errorf(codes.PermissionDenied, "%s may not %s: only %s agents may", a, verb, kind)
	}
	if a.Backup != name || a.Location != location {
		return status.Errorf(codes.PermissionDenied,
			"%s may %s only backup %q in location %q, not %q in location %q", a, verb, a.Backup, a.Location, name, location)
	}
	return nil
}
