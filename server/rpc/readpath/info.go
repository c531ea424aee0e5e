package readpath

import (
	"context"
	"fmt"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/stream"
)

// GetServerInfo implements ebv1.InfoServiceServer.
func (s *Service) GetServerInfo(context.Context, *ebv1.GetServerInfoRequest) (*ebv1.GetServerInfoResponse, error) {
	resp := &ebv1.GetServerInfoResponse{
		Version:   version.Version,
		GitCommit: version.Commit(),
		Limits: &ebv1.ServerLimits{
			MaxChunkBytes: stream.MaxChunkBytes,
			MaxNameLength: edge.MaxNameLength,
		},
	}
	for i, t := range s.targets {
		resp.Targets = append(resp.Targets, &ebv1.EtcdTarget{Name: t.Name, Endpoints: t.Endpoints, Default: i == 0})
	}
	for i, l := range s.locations.All() {
		sl := &ebv1.StorageLocation{
			Name:        l.Name,
			Type:        l.Type(),
			Default:     i == 0,
			Description: l.Describe(),
		}
		if ue := l.Unavailable(); ue != nil {
			sl.Unavailable = true
			sl.Error = fmt.Sprintf("%v (since %s)", ue.Err, ue.Since.UTC().Format(time.RFC3339))
		}
		resp.Locations = append(resp.Locations, sl)
	}
	return resp, nil
}
