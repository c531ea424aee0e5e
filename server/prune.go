package server

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Labels of scheduled backups.
const (
	LabelScheduled = "etcdbackup.io/scheduled"
	LabelTarget    = "etcdbackup.io/target"
)

// inUse tracks the backups this server is sending (downloads) and those
// retention is removing, so that neither happens to the other: retention
// keeps a backup being downloaded, and a download of a backup being
// removed is refused.
type inUse struct {
	mu        sync.Mutex
	downloads map[string]int
	removing  map[string]bool
}

// download marks a download of loc/name; done ends it.
func (u *inUse) download(loc, name string) (done func(), err error) {
	key := loc + "/" + name
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.removing[key] {
		return nil, status.Errorf(codes.NotFound, "backup %q in location %q is being removed by retention", name, loc)
	}
	if u.downloads == nil {
		u.downloads = map[string]int{}
	}
	u.downloads[key]++
	return func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.downloads[key]--; u.downloads[key] == 0 {
			delete(u.downloads, key)
		}
	}, nil
}

// remove marks loc/name as being removed, unless it is being downloaded.
func (u *inUse) remove(loc, name string) (done func(), ok bool) {
	key := loc + "/" + name
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.downloads[key] > 0 {
		return nil, false
	}
	if u.removing == nil {
		u.removing = map[string]bool{}
	}
	u.removing[key] = true
	return func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		delete(u.removing, key)
	}, true
}

// ofTarget tells whether m is a backup of target: labelled so (scheduled
// backups, and any a user labelled) or, when unscheduled ones count too,
// taken by an agent of it.
func ofTarget(m *storage.Manifest, target string, includeUnscheduled bool) bool {
	if !includeUnscheduled {
		return m.Labels[LabelScheduled] == "true" && m.Labels[LabelTarget] == target
	}
	return m.Labels[LabelTarget] == target || (m.Source.Kind == sourceAgent && m.Source.Target == target)
}

// selectPrunable returns what retention r removes of target's backups
// among manifests (one location), newest first: those beyond the newest
// KeepLast, and those older than MaxAge — never the newest.
func selectPrunable(manifests []*storage.Manifest, target string, r config.Retention, includeUnscheduled bool, now time.Time) []*storage.Manifest {
	var mine []*storage.Manifest
	for _, m := range manifests {
		if ofTarget(m, target, includeUnscheduled) {
			mine = append(mine, m)
		}
	}
	sort.Slice(mine, func(i, j int) bool {
		if !mine[i].CreateTime.Equal(mine[j].CreateTime) {
			return mine[i].CreateTime.After(mine[j].CreateTime)
		}
		return mine[i].Name < mine[j].Name
	})
	var out []*storage.Manifest
	for i, m := range mine {
		if i == 0 {
			continue // the newest is the one to restore from
		}
		if (r.KeepLast > 0 && i >= r.KeepLast) || (r.MaxAge.Duration > 0 && now.Sub(m.CreateTime) > r.MaxAge.Duration) {
			out = append(out, m)
		}
	}
	return out
}

// PruneBackups implements ebv1.BackupServiceServer.
func (s *Server) PruneBackups(ctx context.Context, req *ebv1.PruneBackupsRequest) (*ebv1.PruneBackupsResponse, error) {
	var targets []config.Target
	if req.GetTarget() != "" {
		t, err := s.target(req.GetTarget())
		if err != nil {
			return nil, err
		}
		if t.Retention == nil {
			return nil, status.Errorf(codes.FailedPrecondition,
				"target %q has no retention configured; add `retention: {keepLast: N, maxAge: DURATION}` to it in the server's config", t.Name)
		}
		targets = append(targets, *t)
	} else {
		for _, t := range s.targets {
			if t.Retention != nil {
				targets = append(targets, t)
			}
		}
	}
	locs := s.order
	if req.GetLocation() != "" {
		name, _, err := s.location(req.GetLocation())
		if err != nil {
			return nil, err
		}
		locs = []string{name}
	}
	resp := &ebv1.PruneBackupsResponse{}
	for _, locName := range locs {
		if len(targets) == 0 {
			break
		}
		manifests, err := s.locations[locName].List(ctx)
		if err != nil {
			return nil, s.metrics.StorageError("list", locName, "", err)
		}
		for _, t := range targets {
			pruned, inUse, err := s.prune(ctx, locName, manifests, t, req.GetIncludeUnscheduled(), req.GetDryRun(), caller(ctx))
			if err != nil {
				return resp, err
			}
			resp.Pruned = append(resp.Pruned, pruned...)
			resp.InUse = append(resp.InUse, inUse...)
		}
	}
	return resp, nil
}

// prune applies t's retention to its backups in one location.
func (s *Server) prune(ctx context.Context, locName string, manifests []*storage.Manifest, t config.Target, includeUnscheduled, dryRun bool, by string) (pruned, inUse []*ebv1.Backup, err error) {
	loc := s.locations[locName]
	for _, m := range selectPrunable(manifests, t.Name, *t.Retention, includeUnscheduled, s.now()) {
		b := backupFromManifest(locName, m)
		busy, err := s.beingRestored(ctx, locName, m.Name)
		if err != nil {
			return pruned, inUse, err
		}
		if busy {
			inUse = append(inUse, b)
			continue
		}
		if dryRun {
			pruned = append(pruned, b)
			continue
		}
		done, ok := s.inUse.remove(locName, m.Name)
		if !ok {
			inUse = append(inUse, b)
			continue
		}
		err = loc.Delete(ctx, m.Name)
		done()
		if errors.Is(err, storage.ErrNotFound) {
			continue // someone else removed it
		}
		if err != nil {
			return pruned, inUse, s.metrics.StorageError("delete", locName, m.Name, err)
		}
		s.metrics.Pruned.WithLabelValues(t.Name, locName).Inc()
		s.log.Info("backup removed by retention", "location", locName, "backup", m.Name, "target", t.Name, "caller", by)
		pruned = append(pruned, b)
	}
	return pruned, inUse, nil
}

// beingRestored tells whether a running restore Job reads the backup.
func (s *Server) beingRestored(ctx context.Context, locName, name string) (bool, error) {
	if s.agents == nil {
		return false, nil
	}
	running, err := s.agents.RunningRestores(ctx, locName, name, s.targets)
	if err != nil {
		return false, status.Errorf(codes.Unavailable, "cannot check for restores of backup %q before removing it: %v", name, err)
	}
	return len(running) > 0, nil
}
