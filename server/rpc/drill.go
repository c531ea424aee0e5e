package rpc

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
)

// DrillBackup implements ebv1.BackupServiceServer: the request's checks,
// then the start (server/work) the controller's drill schedules make
// too.
func (s *Service) DrillBackup(ctx context.Context, req *ebv1.DrillBackupRequest) (*ebv1.DrillBackupResponse, error) {
	if s.agents == nil {
		return nil, status.Error(codes.FailedPrecondition,
			"this server cannot launch agents (it runs outside a cluster or without an agent image), so it cannot drill; "+
				"`kubectl etcdbackup verify` checks a backup on the server, `restore --local` into a scratch directory proves it restores")
	}
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	by := "user"
	if u, ok := auth.UserFrom(ctx); ok && u.Username != "" {
		by = u.Username
	}
	d, err := s.work.StartDrill(ctx, work.DrillRequest{Location: req.GetLocation(), Name: req.GetName(), By: by})
	if errors.Is(err, domain.ErrAlreadyRunning) {
		return nil, status.Errorf(codes.AlreadyExists, "a drill of backup %q is already running; its verdict appears in `kubectl etcdbackup describe %s`", req.GetName(), req.GetName())
	}
	if err != nil {
		return nil, edge.Status("drill", err)
	}
	return &ebv1.DrillBackupResponse{Job: d.Job, StartTime: timestamppb.New(d.Created)}, nil
}
