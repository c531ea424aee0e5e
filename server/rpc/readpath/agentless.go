package readpath

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
)

// A server that launches no agents (break-glass; a server outside a
// cluster) has no agent logs or events: it says so for a backup it
// could have, as describe expects ("Events: <none>"). server/rpc's
// Service answers these itself when it launches agents, and with these
// when it does not.

// GetBackupLogs implements ebv1.BackupServiceServer.
func (s *Service) GetBackupLogs(req *ebv1.GetBackupLogsRequest, _ ebv1.BackupService_GetBackupLogsServer) error {
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return err
	}
	if _, _, err := s.location(req.GetLocation()); err != nil {
		return err
	}
	return status.Error(codes.FailedPrecondition, "this server launches no agents, so there are no agent logs")
}

// GetBackupEvents implements ebv1.BackupServiceServer.
func (s *Service) GetBackupEvents(_ context.Context, req *ebv1.GetBackupEventsRequest) (*ebv1.GetBackupEventsResponse, error) {
	if err := edge.ValidateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	if _, _, err := s.location(req.GetLocation()); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.FailedPrecondition, "this server launches no agents, so there are no agent events")
}
