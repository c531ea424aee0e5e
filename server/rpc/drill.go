package rpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// DrillBackup implements ebv1.BackupServiceServer.
func (s *Service) DrillBackup(ctx context.Context, req *ebv1.DrillBackupRequest) (*ebv1.DrillBackupResponse, error) {
	by := "user"
	if u, ok := auth.UserFrom(ctx); ok && u.Username != "" {
		by = u.Username
	}
	return s.StartDrill(ctx, req.GetLocation(), req.GetName(), false, by)
}

// StartDrill launches the drill agent Job of backup (location, name) after
// the checks DrillBackup makes; the controller's drill schedule calls it
// too, with scheduled set. by names who started it, for the log.
func (s *Service) StartDrill(ctx context.Context, location, name string, scheduled bool, by string) (*ebv1.DrillBackupResponse, error) {
	if s.agents == nil {
		return nil, status.Error(codes.FailedPrecondition,
			"this server cannot launch agents (it runs outside a cluster or without an agent image), so it cannot drill; "+
				"`kubectl etcdbackup verify` checks a backup on the server, `restore --local` into a scratch directory proves it restores")
	}
	if err := validateName("backup", name); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(location)
	if err != nil {
		return nil, err
	}
	m, err := loc.Stat(ctx, name)
	if err != nil {
		return nil, s.metrics.StorageError("drill", locName, name, err)
	}
	if m.Etcd == nil || !m.Etcd.Keyspace {
		return nil, status.Errorf(codes.FailedPrecondition,
			"backup %q records no keyspace fingerprint (it was stored by an older version), so a drill has nothing to compare a restore with; take a new backup and drill that one", name)
	}
	// Only a target's own backup is drilled as the target's: an upload
	// that claims a target gets neither its drill identity nor its
	// verdict metrics.
	spec := jobs.DrillSpec{Backup: name, Location: locName, SHA256: m.SHA256, Scheduled: scheduled}
	if m.OfTarget(m.Source.Target) {
		spec.Target = m.Source.Target
		for _, t := range s.targets {
			if t.Name == spec.Target && t.Drill != nil {
				spec.IdentitySecret = t.Drill.IdentitySecret
			}
		}
	}
	job, err := s.agents.StartDrill(ctx, spec)
	if errors.Is(err, jobs.ErrRunning) {
		return nil, status.Errorf(codes.AlreadyExists, "a drill of backup %q is already running; its verdict appears in `kubectl etcdbackup describe %s`", name, name)
	}
	if errors.Is(err, jobs.ErrIdentitySecret) {
		// The configuration, not the backup, is at fault; the error
		// still wraps err for the controller's drill schedule.
		return nil, &preconditionError{err: err, msg: fmt.Sprintf("the drill of backup %q did not start, nothing was learned about the backup: %v", name, err)}
	}
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "start drill agent for %q: %v", name, err)
	}
	s.log.Info("drill agent started", "backup", name, "location", locName, "target", spec.Target, "job", job.Name, "caller", by)
	return &ebv1.DrillBackupResponse{Job: job.Name, StartTime: timestamppb.New(job.CreationTimestamp.Time)}, nil
}

// preconditionError is a FailedPrecondition status that keeps the error
// it reports, so that errors.Is finds it (the controller tells an
// identity Secret problem apart by it).
type preconditionError struct {
	err error
	msg string
}

func (e *preconditionError) Error() string { return e.msg }
func (e *preconditionError) Unwrap() error { return e.err }

// GRPCStatus makes e a FailedPrecondition status for gRPC.
func (e *preconditionError) GRPCStatus() *status.Status {
	return status.New(codes.FailedPrecondition, e.msg)
}
