package rpc

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// CreateBackup implements ebv1.BackupServiceServer: the request's
// checks, then the start (server/work) the controller's schedules make
// too, so both make the same Jobs, which the agent guard admits.
func (s *Service) CreateBackup(ctx context.Context, req *ebv1.CreateBackupRequest) (*ebv1.CreateBackupResponse, error) {
	// The name and compression are checked once the target's defaults
	// fill them in.
	check := func(name, compression string) error {
		if err := validateCompression(compression); err != nil {
			return err
		}
		if err := edge.ValidateName("backup", name); err != nil {
			return err
		}
		if req.GetName() != "" {
			if err := s.reservedName("create backup", name); err != nil {
				return err
			}
		}
		return validateLabels(req.GetLabels(), s.limits)
	}
	b, err := s.work.StartBackup(ctx, work.BackupRequest{
		Name: req.GetName(), Location: req.GetLocation(), Target: req.GetTarget(), Compression: req.GetCompression(),
		Labels: req.GetLabels(), By: caller(ctx), Check: check,
	})
	var running *domain.AlreadyRunningError
	switch {
	case errors.Is(err, domain.ErrNoAgents):
		return nil, status.Error(codes.FailedPrecondition,
			"this server cannot launch backup agents (it runs outside a cluster or without an agent image); upload snapshots with `kubectl etcdbackup upload` instead")
	case errors.As(err, &running):
		return nil, status.Errorf(codes.AlreadyExists, "backup %q is already being taken; follow it with `kubectl etcdbackup logs %s -f`", running.Name, running.Name)
	case err != nil:
		return nil, edge.Status("create backup", err)
	}
	t := b.Target
	var msg string
	if b.KitErr != nil {
		msg = b.KitErr.Error()
	}
	return &ebv1.CreateBackupResponse{Backup: &ebv1.Backup{
		Name: b.Name, Location: b.Location, Phase: ebv1.BackupPhase_BACKUP_PHASE_RUNNING, Message: msg,
		Labels: b.Labels, Compression: b.Compression, CreateTime: timestamppb.New(b.Created),
		Encryption: t.EncryptionName(), AgeRecipients: t.AgeRecipients(),
		Source: &ebv1.BackupSource{Kind: ebv1.SourceAgent, Target: t.Name},
	}}, nil
}

// GetBackupLogs implements ebv1.BackupServiceServer.
func (s *Service) GetBackupLogs(req *ebv1.GetBackupLogsRequest, stream ebv1.BackupService_GetBackupLogsServer) error {
	if s.agents == nil {
		return s.Service.GetBackupLogs(req, stream)
	}
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return err
	}
	locName, _, err := s.location(req.GetLocation())
	if err != nil {
		return err
	}
	w := &logWriter{stream: stream}
	err = s.agents.Logs(stream.Context(), locName, req.GetName(), req.GetFollow(), w)
	if errors.Is(err, jobs.ErrNoRun) {
		return status.Errorf(codes.NotFound,
			"no agent log for backup %q in location %q: it was uploaded, or its agent Job was cleaned up (finished Jobs are kept for a day)", req.GetName(), locName)
	}
	if err != nil && stream.Context().Err() == nil {
		return ebv1.ServerErrorf(codes.Unavailable, "agent log of %q: %v", req.GetName(), err)
	}
	return nil
}

// logWriter sends what it is given as log chunks of bounded size.
type logWriter struct {
	stream ebv1.BackupService_GetBackupLogsServer
}

func (w *logWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 64 << 10 {
		end := min(off+64<<10, len(p))
		if err := w.stream.Send(&ebv1.GetBackupLogsResponse{Data: p[off:end]}); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// GetBackupEvents implements ebv1.BackupServiceServer.
func (s *Service) GetBackupEvents(ctx context.Context, req *ebv1.GetBackupEventsRequest) (*ebv1.GetBackupEventsResponse, error) {
	if s.agents == nil {
		return s.Service.GetBackupEvents(ctx, req)
	}
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, _, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	job, events, err := s.agents.Events(ctx, locName, req.GetName())
	if errors.Is(err, jobs.ErrNoRun) {
		return nil, status.Errorf(codes.NotFound,
			"no agent Job for backup %q in location %q: it was uploaded, or its agent Job was cleaned up (finished Jobs are kept for a day)", req.GetName(), locName)
	}
	if err != nil {
		// Most likely the server's Role lacks "list events" (an older
		// manifest): say so rather than hide it.
		return nil, ebv1.ServerErrorf(codes.Unavailable, "events of the agent of %q: %v", req.GetName(), err)
	}
	resp := &ebv1.GetBackupEventsResponse{JobName: job}
	for _, e := range events {
		ev := &ebv1.JobEvent{
			Type: e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count,
			Object: strings.ToLower(e.InvolvedObject.Kind) + "/" + e.InvolvedObject.Name,
		}
		if !e.FirstTimestamp.IsZero() {
			ev.FirstTime = timestamppb.New(e.FirstTimestamp.Time)
		}
		switch {
		case !e.LastTimestamp.IsZero():
			ev.LastTime = timestamppb.New(e.LastTimestamp.Time)
		case !e.EventTime.IsZero():
			ev.LastTime = timestamppb.New(e.EventTime.Time)
		}
		resp.Events = append(resp.Events, ev)
	}
	return resp, nil
}

// reservedName refuses a name a user chose when it has the form of a
// target's scheduled backups: taken, it would stop that run.
func (s *Service) reservedName(what, name string) error {
	if b, ok := storage.KitOf(name); ok {
		return status.Errorf(codes.InvalidArgument, "%s: the name %q ends in %q, which names the recovery kit of backup %q; choose another name", what, name, storage.KitSuffix, b)
	}
	if t, kind, ok := s.targets.ReservedBy(name); ok {
		return edge.Status(what, &domain.ReservedNameError{Name: name, Target: t, Kind: kind})
	}
	return nil
}
