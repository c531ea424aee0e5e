package rpc

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/rpc/internal/edge"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// PruneBackups implements ebv1.BackupServiceServer.
func (s *Service) PruneBackups(ctx context.Context, req *ebv1.PruneBackupsRequest) (*ebv1.PruneBackupsResponse, error) {
	var targets []config.Target
	if req.GetTarget() != "" {
		t, err := s.target(req.GetTarget())
		if err != nil {
			return nil, err
		}
		if t.Retention == nil {
			return nil, status.Errorf(codes.FailedPrecondition,
				"target %q has no retention configured; add `retention: {keepLast: N, keepDaily: N, …, maxAge: DURATION}` to it in the server's config", t.Name)
		}
		targets = append(targets, *t)
	} else {
		for _, t := range s.targets {
			if t.Retention != nil {
				targets = append(targets, t)
			}
		}
	}
	locs := s.locations.All()
	if req.GetLocation() != "" {
		l, err := s.locations.Get(req.GetLocation())
		if err != nil {
			return nil, edge.Status("", err)
		}
		locs = []*domain.Location{l}
	}
	resp := &ebv1.PruneBackupsResponse{}
	for _, loc := range locs {
		if len(targets) == 0 {
			break
		}
		locName := loc.Name
		manifests, err := loc.List(ctx)
		if err != nil {
			return nil, edge.StorageStatus("list", locName, "", err)
		}
		for _, t := range targets {
			res, err := s.pruner.Prune(ctx, retention.Request{
				Location: loc, Manifests: manifests, Policy: retention.PolicyOf(t, req.GetIncludeUnscheduled()),
				DryRun: req.GetDryRun(), By: caller(ctx),
			})
			if err != nil {
				return resp, edge.Status("delete", err)
			}
			resp.Pruned = append(resp.Pruned, backupsFromManifests(locName, res.Pruned)...)
			resp.InUse = append(resp.InUse, backupsFromManifests(locName, res.InUse)...)
			for _, d := range res.Kept {
				resp.Kept = append(resp.Kept, &ebv1.KeptBackup{Backup: edge.Backup(locName, d.Manifest), Rules: d.Rules})
			}
		}
	}
	return resp, nil
}

// backupsFromManifests is edge.Backup of each of ms.
func backupsFromManifests(loc string, ms []*storage.Manifest) []*ebv1.Backup {
	var out []*ebv1.Backup
	for _, m := range ms {
		out = append(out, edge.Backup(loc, m))
	}
	return out
}
