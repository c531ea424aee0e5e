// Package readpath is the read path of the data server's request layer:
// the handlers that only read storage — GetServerInfo, ListBackups,
// GetBackup, DownloadBackup, VerifyBackup — with every check of theirs
// (the stored SHA-256, etcd's trailer, the decompression bound, age's
// header, an unavailable location's LOCATION_UNAVAILABLE). server/rpc's
// Service embeds it and injects, as Hooks, what is request-layer policy
// there (who calls, what an agent may read, what a download holds);
// server/breakglass serves it alone, over locations opened read-only, in
// the plugin's process. It links nothing that runs the server: no Jobs,
// no authorization, no controller, no coordination.
package readpath

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/stream"
)

// Config is what a Service needs.
type Config struct {
	// Locations are the storage locations it reads.
	Locations *domain.Locations
	// Targets are the etcd targets GetServerInfo names (GetBackup shows
	// the delta chain of those that capture deltas); none for
	// break-glass.
	Targets []config.Target
	// Logger nil logs nothing; Now nil is time.Now; Metrics nil counts
	// in series no registry exports.
	Logger  *slog.Logger
	Now     func() time.Time
	Metrics *metrics.Metrics
	// ScratchDir holds temporary files of VerifyBackup; "" is os.TempDir().
	ScratchDir string
	// Limits, with their defaults (config.Limits.WithDefaults).
	Limits config.Limits
	Hooks  Hooks
	// BreakGlass names who reads in the plugin's break-glass process
	// ("break-glass on HOST"): downloads are recorded in the ledger as
	// break-glass reads by it. Empty on the data server.
	BreakGlass string
	// Copies answers what the copier knows of copies not made yet; nil
	// (break-glass, a replica that does not lead) knows nothing.
	Copies domain.CopyTracker
}

// Hooks are the request layer's policy the read path defers to. A nil
// hook is what break-glass needs: no agents, nothing else to keep.
type Hooks struct {
	// Caller names who made a call, for the log; nil names every caller
	// "port-forward".
	Caller func(ctx context.Context) string
	// MayGet refuses a GetBackup of backup name in location before any
	// lookup (an agent reads only its own chain's full backup).
	MayGet func(ctx context.Context, name, location string) error
	// MayDownload refuses a download, or pins it to the content its
	// caller may read (an agent: its backup's, or a delta segment's its
	// Job lists); a nil Pin reads whatever is stored.
	MayDownload func(ctx context.Context, name, location string) (*Pin, error)
	// Sending registers a download of backup name in location until done
	// is called, so that retention keeps the backup; nil registers
	// nothing.
	Sending func(ctx context.Context, location, name string) (done func(), err error)
	// Runs are the agent runs of location whose backups are not stored,
	// as backups (running or failed), by name; nil has none.
	Runs func(ctx context.Context, location string) (map[string]*ebv1.Backup, error)
}

// Pin is the one content a download's caller may read under a name.
type Pin struct {
	// Who is the caller, for the refusal.
	Who string
	// SHA256 is the stored content it may read.
	SHA256 string
}

// Service implements the read-only calls of ebv1.InfoServiceServer and
// ebv1.BackupServiceServer; the rest are Unimplemented, but for the
// agent logs and events of a server that launches no agents (agentless.go).
type Service struct {
	ebv1.UnimplementedInfoServiceServer
	ebv1.UnimplementedBackupServiceServer

	locations  *domain.Locations
	targets    []config.Target
	log        *slog.Logger
	now        func() time.Time
	metrics    *metrics.Metrics
	scratchDir string
	limits     config.Limits
	hooks      Hooks
	copies     domain.CopyTracker
	breakGlass bool
	// reads keeps the ledger at an entry per read, not per ranged call.
	reads recentReads
	// paged keeps listings being paged through (pages.go).
	paged pagedListings
	// verifies bounds what VerifyBackup unpacks into scratchDir at once;
	// its zero value has the defaults.
	verifies verifyGate
	// handoff, closed by HandOffDownloads, ends the downloads in flight
	// and those that start after.
	handoff     chan struct{}
	handoffOnce sync.Once
}

// New returns the Service cfg describes.
func New(cfg Config) *Service {
	s := &Service{
		locations:  cfg.Locations,
		targets:    cfg.Targets,
		log:        cfg.Logger,
		now:        cfg.Now,
		metrics:    cfg.Metrics,
		scratchDir: cfg.ScratchDir,
		limits:     cfg.Limits,
		copies:     cfg.Copies,
		hooks:      cfg.Hooks,
		breakGlass: cfg.BreakGlass != "",
		verifies:   verifyGate{budget: cfg.Limits.VerifyScratchBytes},
		handoff:    make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if who := cfg.BreakGlass; who != "" && s.hooks.Caller == nil {
		s.hooks.Caller = func(context.Context) string { return who }
	}
	if s.metrics == nil {
		s.metrics, _ = metrics.New(nil) // registers nothing, so cannot fail
	}
	return s
}

// ServerOptions are the options of a gRPC server the handlers' streams
// need: the message size a chunk takes, the codec that moves chunks
// without copies, and the pool received frames come from.
func ServerOptions() []grpc.ServerOption { return stream.ServerOptions() }

// Register adds the info and backup services to g, which must have
// ServerOptions (downloads need its codec).
func (s *Service) Register(g grpc.ServiceRegistrar) {
	ebv1.RegisterInfoServiceServer(g, s)
	ebv1.RegisterBackupServiceServer(g, s)
}

// HandOffDownloads ends every download in flight, and every one that
// starts later, with Unavailable, so that their clients resume them at
// once on another replica instead of waiting for this one to drain: for
// a replica that is shutting down while others serve. Uploads are left
// to finish.
func (s *Service) HandOffDownloads() {
	s.handoffOnce.Do(func() { close(s.handoff) })
}

// location resolves a request's location name ("" is the default), or
// refuses it: not configured, or unavailable now.
func (s *Service) location(name string) (string, *domain.Location, error) {
	l, err := s.locations.Get(name)
	if err != nil {
		return "", nil, edge.Status("", err)
	}
	return l.Name, l, nil
}

// readAction is what the ledger calls a download here: a break-glass
// read in the plugin's process, a download on the data server.
func (s *Service) readAction() string {
	if s.breakGlass {
		return ledger.ActionBreakGlass
	}
	return ledger.ActionDownload
}

// caller names who made a call, for the log.
func (s *Service) caller(ctx context.Context) string {
	if s.hooks.Caller == nil {
		return "port-forward"
	}
	return s.hooks.Caller(ctx)
}

// runs are the agent runs of location whose backups are not stored.
func (s *Service) runs(ctx context.Context, location string) (map[string]*ebv1.Backup, error) {
	if s.hooks.Runs == nil {
		return nil, nil
	}
	return s.hooks.Runs(ctx, location)
}

// run returns the agent run of a backup that is not stored, or nil.
func (s *Service) run(ctx context.Context, location, name string) *ebv1.Backup {
	runs, err := s.runs(ctx, location)
	if err != nil {
		return nil
	}
	return runs[name]
}
