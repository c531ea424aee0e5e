package rpc

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// DeleteBackup implements ebv1.BackupServiceServer.
func (s *Service) DeleteBackup(ctx context.Context, req *ebv1.DeleteBackupRequest) (*ebv1.DeleteBackupResponse, error) {
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	if chain, ok := storage.ChainOf(req.GetName()); ok {
		if m, err := loc.Stat(ctx, req.GetName()); err == nil && m.IsSegment() {
			return nil, status.Errorf(codes.FailedPrecondition,
				"%q is a delta segment of backup %q's chain: segments go only with their full backup; delete %q to remove the chain", req.GetName(), chain, chain)
		}
	}
	if backup, ok := storage.KitOf(req.GetName()); ok {
		if m, err := loc.Stat(ctx, req.GetName()); err == nil && m.IsKit() {
			return nil, status.Errorf(codes.FailedPrecondition,
				"%q is the recovery kit of backup %q: a kit goes only with its backup; delete %q to remove both", req.GetName(), backup, backup)
		}
	}
	if err := s.checkNoRestoreReads(ctx, locName, req.GetName()); err != nil {
		return nil, err
	}
	all, listErr := loc.List(ctx)
	backups, parts := storage.SplitParts(all)
	var sha256 string
	if i := slices.IndexFunc(backups, func(m *storage.Manifest) bool { return m.Name == req.GetName() }); i >= 0 {
		// The parts go with the backup: while one of them is under object
		// lock, nothing of it is deleted (the backup's own lock the store
		// checks again in Delete).
		if until := storage.LockedUntil(backups[i], parts); until.After(s.now()) {
			return nil, edge.StorageStatus("delete", locName, req.GetName(), &storage.LockedError{Name: req.GetName(), Until: until})
		}
		sha256 = backups[i].SHA256
	}
	if err := loc.Delete(ctx, req.GetName()); err != nil {
		return nil, edge.StorageStatus("delete", locName, req.GetName(), err)
	}
	s.inUse.Removed(ctx, locName, req.GetName(), s.log)
	s.record(ctx, locName, ledger.Entry{Action: ledger.ActionDelete, Backup: req.GetName(), SHA256: sha256, Who: caller(ctx)})
	if listErr == nil {
		if n, err := storage.DeleteParts(ctx, loc, parts, req.GetName()); err != nil || n > 0 {
			s.log.Info("delta chain and recovery kit removed with their backup", "location", locName, "backup", req.GetName(), "parts", n, "error", err)
		}
	}
	s.log.Info("backup deleted", "location", locName, "backup", req.GetName(), "caller", caller(ctx))
	return &ebv1.DeleteBackupResponse{}, nil
}

// checkNoRestoreReads refuses to delete a backup a running restore Job
// reads: its agent would find it gone, or, if it were uploaded again,
// not the content the restore was started for.
func (s *Service) checkNoRestoreReads(ctx context.Context, locName, name string) error {
	running, err := s.inUse.RestoresReading(ctx, locName, name, "deleting")
	if err != nil {
		return edge.Status("delete", err)
	}
	if len(running) > 0 {
		ns, job, _ := strings.Cut(running[0], "/")
		return status.Errorf(codes.FailedPrecondition,
			"backup %q in location %q is being restored by Job %s; wait for the restore to finish, or abandon it with `kubectl -n %s delete job %s`, then delete the backup",
			name, locName, strings.Join(running, ", "), ns, job)
	}
	return nil
}

// runs returns the agent runs of location whose backup is not stored, as
// backups in phase RUNNING or FAILED. A run that succeeded has its backup
// stored and listed from storage instead.
func (s *Service) runs(ctx context.Context, locName string) (map[string]*ebv1.Backup, error) {
	if s.agents == nil {
		return nil, nil
	}
	runs, err := s.agents.List(ctx)
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Unavailable, "list backup agents: %v", err)
	}
	out := map[string]*ebv1.Backup{}
	for _, r := range runs {
		if r.Location != locName {
			continue
		}
		b := &ebv1.Backup{
			Name: r.Name, Location: r.Location, Message: r.Message,
			CreateTime: timestamppb.New(r.StartTime),
			Source:     &ebv1.BackupSource{Kind: ebv1.SourceAgent, Target: r.Target, StartTime: timestamppb.New(r.StartTime)},
		}
		switch r.Phase {
		case jobs.PhaseRunning:
			b.Phase = ebv1.BackupPhase_BACKUP_PHASE_RUNNING
		case jobs.PhaseFailed:
			b.Phase = ebv1.BackupPhase_BACKUP_PHASE_FAILED
		case jobs.PhaseSucceeded:
			// Stored, or about to be listed; if storage lacks it after the
			// agent exited 0, something is badly wrong: say so.
			b.Phase = ebv1.BackupPhase_BACKUP_PHASE_FAILED
			b.Message = "the agent finished but the backup is not in storage"
		}
		out[r.Name] = b
	}
	return out, nil
}
