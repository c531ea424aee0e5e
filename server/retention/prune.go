package retention

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Pruner removes what a target's retention selects, except what is in
// use: for PruneBackups and after each successful scheduled run.
type Pruner struct {
	InUse   *InUse
	Metrics *metrics.Metrics
	Log     *slog.Logger
	Now     func() time.Time
}

// Request is one prune: one target's backups in one location.
type Request struct {
	// Location is where the backups are.
	Location *domain.Location
	// Manifests are the location's backups (its List).
	Manifests []*storage.Manifest
	// Target's Retention must be set.
	Target config.Target
	// IncludeUnscheduled counts the target's other agent backups too.
	IncludeUnscheduled bool
	// DryRun removes nothing: pruned is what would go.
	DryRun bool
	// By is who asked, for the log.
	By string
}

// Prune applies r.Target's retention to its backups in one location. It
// returns the backups removed (with DryRun, those that would be) and
// those kept because they are in use; the next prune takes them.
func (p *Pruner) Prune(ctx context.Context, r Request) (pruned, inUse []*storage.Manifest, err error) {
	loc := r.Location.Name
	// Delta segments and kits are not backups: they go only with their
	// backup.
	backups, parts := storage.SplitParts(r.Manifests)
	for _, m := range Select(backups, r.Target.Name, *r.Target.Retention, r.IncludeUnscheduled, p.Now()) {
		restores, err := p.InUse.RestoresReading(ctx, loc, m.Name, "removing")
		if err != nil {
			return pruned, inUse, err
		}
		if len(restores) > 0 {
			inUse = append(inUse, m)
			continue
		}
		if r.DryRun {
			pruned = append(pruned, m)
			continue
		}
		done, ok, err := p.InUse.remove(ctx, loc, m.Name)
		if err != nil {
			return pruned, inUse, err
		}
		if !ok {
			inUse = append(inUse, m)
			continue
		}
		err = r.Location.Delete(ctx, m.Name)
		done()
		if errors.Is(err, storage.ErrNotFound) {
			continue // someone else removed it
		}
		if err != nil {
			return pruned, inUse, &domain.StorageError{Location: loc, Name: m.Name, Err: err}
		}
		p.InUse.Removed(ctx, loc, m.Name, p.Log)
		if n, err := storage.DeleteParts(ctx, r.Location, parts, m.Name); err != nil {
			p.Log.Warn("removing the delta chain and recovery kit of a removed backup", "location", loc, "backup", m.Name, "removed", n, "error", err)
		}
		p.Metrics.Pruned.WithLabelValues(r.Target.Name, loc).Inc()
		p.Log.Info("backup removed by retention", "location", loc, "backup", m.Name, "target", r.Target.Name, "caller", r.By)
		pruned = append(pruned, m)
	}
	return pruned, inUse, nil
}
