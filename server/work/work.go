// Package work starts the agent work the data server does on request
// and on its own: a backup (CreateBackup, a target's schedule, a delta
// chain's new full) and a restore drill (DrillBackup, a target's drill
// schedule). The request layer and the controller both start work here,
// so that every start makes the same checks and the same Jobs, which the
// agent guard admits. Errors are the domain's (server/domain): the
// request layer turns them into statuses, the controller decides on them.
package work

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Starter starts agent work over one server's locations, targets and
// Job launcher.
type Starter struct {
	locations *domain.Locations
	targets   domain.Targets
	// agents nil: the server launches none, and every start is refused
	// with domain.ErrNoAgents.
	agents *jobs.Launcher
	log    *slog.Logger
	now    func() time.Time
}

// New returns a Starter; agents nil refuses every start, log nil logs
// nothing, now nil is time.Now.
func New(locs *domain.Locations, targets []config.Target, agents *jobs.Launcher, log *slog.Logger, now func() time.Time) *Starter {
	s := &Starter{locations: locs, targets: targets, agents: agents, log: log, now: now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// BackupRequest is a backup to start. Empty fields take the target's
// (location, compression) or the defaults (the default target; the name
// TARGET-YYYYMMDD-HHMMSS).
type BackupRequest struct {
	Name, Location, Target, Compression string
	Labels                              map[string]string
	// Scheduled marks a run of the target's schedule (its Job's label).
	Scheduled bool
	// ChainBase marks the full a new delta chain starts from: its name
	// is the server's (schedule.ChainName), which no user may choose.
	ChainBase bool
	// By names who asked, for the log.
	By string
	// Check, when set, vets the name and compression once the defaults
	// are filled in (the request layer's validation); its error is
	// returned as it is.
	Check func(name, compression string) error
}

// Backup is a backup whose agent Job was started.
type Backup struct {
	Name, Location, Compression string
	Labels                      map[string]string
	Target                      *config.Target
	// Job is the agent Job's name, Created its creation time.
	Job     string
	Created time.Time
	// KitErr, for a target with a recovery kit, says why its kit agent
	// was not started.
	KitErr error
}

// StartBackup launches the agent Job of a backup. The name must be free
// in the location: stored, it is a domain.StorageError wrapping
// storage.ErrAlreadyExists; being taken, a *domain.AlreadyRunningError;
// a name chosen must not be a schedule's (*domain.ReservedNameError).
func (s *Starter) StartBackup(ctx context.Context, req BackupRequest) (*Backup, error) {
	if s.agents == nil {
		return nil, domain.ErrNoAgents
	}
	t, err := s.targets.Get(req.Target)
	if err != nil {
		return nil, err
	}
	loc, err := s.locations.Get(cmp.Or(req.Location, s.locations.OfTarget(*t)))
	if err != nil {
		return nil, err
	}
	compression := ebv1.CompressionFromName(cmp.Or(req.Compression, t.Compression))
	name := cmp.Or(req.Name, t.Name+"-"+s.now().UTC().Format("20060102-150405"))
	if req.Check != nil {
		if err := req.Check(name, compression); err != nil {
			return nil, err
		}
	}
	// A name chosen, not the schedule's own, must not take a scheduled
	// run's (the request layer's Check says so first, in its order).
	if req.Name != "" && !req.Scheduled && !req.ChainBase {
		if t, kind, ok := s.targets.ReservedBy(name); ok {
			return nil, &domain.ReservedNameError{Name: name, Target: t, Kind: kind}
		}
	}
	if _, err := loc.Stat(ctx, name); err == nil {
		return nil, &domain.StorageError{Location: loc.Name, Name: name, Err: storage.ErrAlreadyExists}
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, &domain.StorageError{Location: loc.Name, Name: name, Err: err}
	}
	if err := s.agents.CheckTarget(ctx, *t); err != nil {
		return nil, &domain.PreconditionError{Msg: err.Error(), Err: err}
	}
	job, err := s.agents.StartBackup(ctx, jobs.BackupSpec{
		Name: name, Location: loc.Name, Compression: compression, Labels: req.Labels, Target: *t,
		AgeRecipients: t.AgeRecipients(), Scheduled: req.Scheduled,
	})
	if errors.Is(err, jobs.ErrRunning) {
		return nil, &domain.AlreadyRunningError{Kind: "backup", Name: name}
	}
	if err != nil {
		return nil, fmt.Errorf("start backup agent for %q: %w", name, err)
	}
	s.log.Info("backup agent started", "backup", name, "location", loc.Name, "target", t.Name, "job", job.Name, "caller", req.By)
	b := &Backup{
		Name: name, Location: loc.Name, Compression: compression, Labels: req.Labels, Target: t,
		Job: job.Name, Created: job.CreationTimestamp.Time,
	}
	if t.Kit != nil {
		// The backup runs whatever becomes of its kit: a backup without
		// one still restores etcd.
		kj, err := s.agents.StartKit(ctx, jobs.KitSpec{Backup: name, Location: loc.Name, Target: *t})
		if err != nil {
			b.KitErr = fmt.Errorf("the backup was started, but not its recovery kit's agent, so it will be stored without a kit: %w", err)
			s.log.Error("kit agent not started", "backup", name, "location", loc.Name, "target", t.Name, "error", err, "caller", req.By)
		} else {
			s.log.Info("kit agent started", "backup", name, "location", loc.Name, "target", t.Name, "job", kj.Namespace+"/"+kj.Name, "node", t.Kit.NodeName)
		}
	}
	return b, nil
}

// DrillRequest is a drill to start: of backup Name in Location ("" the
// default).
type DrillRequest struct {
	Location, Name string
	// Scheduled marks a run of a target's drill schedule.
	Scheduled bool
	// By names who asked, for the log.
	By string
}

// Drill is a drill whose agent Job was started.
type Drill struct {
	Job     string
	Created time.Time
}

// StartDrill launches the drill agent Job of a stored backup. A backup
// that records no keyspace fingerprint, or a target whose drill identity
// Secret is unusable (wrapping jobs.ErrIdentitySecret), is a
// *domain.PreconditionError; a drill of the backup running, a
// *domain.AlreadyRunningError.
func (s *Starter) StartDrill(ctx context.Context, req DrillRequest) (*Drill, error) {
	if s.agents == nil {
		return nil, domain.ErrNoAgents
	}
	name := req.Name
	loc, err := s.locations.Get(req.Location)
	if err != nil {
		return nil, err
	}
	m, err := loc.Stat(ctx, name)
	if err != nil {
		return nil, &domain.StorageError{Location: loc.Name, Name: name, Err: err}
	}
	if m.Etcd == nil || !m.Etcd.Keyspace {
		return nil, &domain.PreconditionError{Msg: fmt.Sprintf(
			"backup %q records no keyspace fingerprint (it was stored by an older version), so a drill has nothing to compare a restore with; take a new backup and drill that one", name)}
	}
	// Only a target's own backup is drilled as the target's: an upload
	// that claims a target gets neither its drill identity nor its
	// verdict metrics.
	spec := jobs.DrillSpec{Backup: name, Location: loc.Name, SHA256: m.SHA256, Scheduled: req.Scheduled, SnapshotBytes: m.PlainSize()}
	if m.OfTarget(m.Source.Target) {
		spec.Target = m.Source.Target
		if t, err := s.targets.Get(spec.Target); err == nil && t.Drill != nil {
			spec.IdentitySecret = t.Drill.IdentitySecret
		}
	}
	job, err := s.agents.StartDrill(ctx, spec)
	if errors.Is(err, jobs.ErrRunning) {
		return nil, &domain.AlreadyRunningError{Kind: "drill", Name: name}
	}
	if errors.Is(err, jobs.ErrIdentitySecret) {
		// The configuration, not the backup, is at fault; the error
		// wraps err for the controller's drill schedule.
		return nil, &domain.PreconditionError{Err: err,
			Msg: fmt.Sprintf("the drill of backup %q did not start, nothing was learned about the backup: %v", name, err)}
	}
	if err != nil {
		return nil, fmt.Errorf("start drill agent for %q: %w", name, err)
	}
	s.log.Info("drill agent started", "backup", name, "location", loc.Name, "target", spec.Target, "job", job.Name, "caller", req.By)
	loc.Note(ctx, s.log, ledger.Entry{Action: ledger.ActionDrill, Backup: name, SHA256: m.SHA256, Who: req.By, Detail: "job " + job.Name})
	return &Drill{Job: job.Name, Created: job.CreationTimestamp.Time}, nil
}
