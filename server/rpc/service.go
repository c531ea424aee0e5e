// Package rpc is the data server's request layer: the handlers of the
// etcdbackup.v1 services, which validate each request, resolve its
// storage location and etcd target, enforce limits and integrity (sizes
// and SHA-256) and answer with status codes a client can act on.
// Requests reach storage only through storage.Location. The read-only
// handlers are server/rpc/readpath's, embedded in Service with this
// package's policy (authorization's callers and agents, retention's
// in-use registry, the agent runs) injected as its hooks.
package rpc

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/coord"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/stream"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/readpath"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

const (
	// MaxChunkBytes is the largest chunk accepted or sent on a stream. It
	// bounds the memory a stream holds, whatever the backup's size.
	MaxChunkBytes = stream.MaxChunkBytes
	// MaxNameLength keeps NAME.json within the 255-byte file-name limit of
	// common file systems; S3 keys allow more, names must work everywhere.
	MaxNameLength = edge.MaxNameLength
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
	// Agents launches the agents (backup, restore, drill, delta, fold)
	// and reads their Jobs; nil refuses whatever needs one.
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
	// Copies answers what the copier knows of copies not made yet.
	Copies domain.CopyTracker
}

// Service implements the etcdbackup.v1 services.
type Service struct {
	// The read path (GetServerInfo, ListBackups, GetBackup,
	// DownloadBackup, VerifyBackup, HandOffDownloads) is promoted from
	// it; Service's own methods answer the rest.
	*readpath.Service
	ebv1.UnimplementedAgentServiceServer

	locations *domain.Locations
	log       *slog.Logger
	now       func() time.Time
	metrics   *metrics.Metrics

	targets domain.Targets
	agents  *jobs.Launcher
	work    *work.Starter
	limits  config.Limits

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
	// checking holds the location check that runs (checklocation.go).
	checking chan struct{}
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
		limits:      cfg.Limits,
		uploads:     claims{perLocation: map[string]int{}},
		coord:       cfg.Coordination,
		inUse:       cfg.InUse,
		pruner:      cfg.Pruner,
		deltaFence:  cfg.DeltaFence,
		deltaLeases: cfg.DeltaLeases,
		checking:    make(chan struct{}, 1),
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
	s.Service = readpath.New(readpath.Config{
		Locations: cfg.Locations, Targets: cfg.Targets, Logger: s.log, Now: s.now, Metrics: s.metrics,
		ScratchDir: cfg.ScratchDir, Limits: cfg.Limits, Copies: cfg.Copies,
		Hooks: readpath.Hooks{
			Caller: caller, MayGet: mayGet, MayDownload: mayDownload, Sending: s.inUse.Download, Runs: s.runs,
		},
	})
	return s
}

// ServerOptions are the options of a gRPC server these handlers' streams
// need: the message size a chunk takes, the codec that moves chunks
// without copies, and the pool received frames come from.
func ServerOptions() []grpc.ServerOption { return stream.ServerOptions() }

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
		return "", nil, edge.Status("", err)
	}
	return l.Name, l, nil
}

// target resolves a request's target name ("" is the default).
func (s *Service) target(name string) (*config.Target, error) {
	t, err := s.targets.Get(name)
	if err != nil {
		return nil, edge.Status("", err)
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

// mayGet holds an agent to its own backup on GetBackup (a delta agent
// reads where its chain starts, a kit agent whether the backup it goes
// with is stored): it learns nothing of other backups, not even whether
// one exists.
func mayGet(ctx context.Context, name, location string) error {
	if a, ok := auth.AgentFrom(ctx); ok && (!agentjob.Of(a.Kind).ReadsRecord || a.Backup != name || a.Location != location) {
		return status.Errorf(codes.PermissionDenied, "%s may read only its own backup %q in location %q", a, a.Backup, a.Location)
	}
	return nil
}

// mayDownload holds an agent to the backup it restores, or a delta
// segment its Job lists, each as stored when its Job was made.
func mayDownload(ctx context.Context, name, location string) (*readpath.Pin, error) {
	a, ok := auth.AgentFrom(ctx)
	if !ok {
		return nil, nil
	}
	sha, err := a.MayDownload(name, location)
	if err != nil {
		return nil, err
	}
	return &readpath.Pin{Who: a.String(), SHA256: sha}, nil
}

// agentMay holds an agent to the one backup its Job was created for.
func agentMay(a *auth.Agent, kind agentjob.Kind, verb, name, location string) error {
	if a.Kind != kind {
		return status.Errorf(codes.PermissionDenied, "%s may not %s: only %s agents may", a, verb, kind)
	}
	if a.Backup != name || a.Location != location {
		return status.Errorf(codes.PermissionDenied,
			"%s may %s only backup %q in location %q, not %q in location %q", a, verb, a.Backup, a.Location, name, location)
	}
	return nil
}

// record appends e to location locName's ledger; a failure is logged,
// and the call goes on (what it records has happened).
func (s *Service) record(ctx context.Context, locName string, e ledger.Entry) {
	if l, ok := s.locations.Lookup(locName); ok {
		l.Note(ctx, s.log, e)
	}
}

// uploadDetail says what kind of object an upload stored, for the ledger.
func uploadDetail(m *storage.Manifest) string {
	switch {
	case m.Kit != nil:
		return "recovery kit of " + m.Kit.Backup
	case m.Source.Kind == ebv1.SourceAgent:
		return "backup of target " + m.Source.Target
	}
	return ""
}
