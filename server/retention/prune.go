package retention

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
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
	// Policy is the target's retention (PolicyOf).
	Policy Policy
	// DryRun removes nothing: pruned is what would go.
	DryRun bool
	// By is who asked, for the log.
	By string
}

// Result is what one prune did.
type Result struct {
	// Pruned are the backups removed (with DryRun, those that would be).
	Pruned []*storage.Manifest
	// InUse are those retention selected but kept because they are in
	// use; the next prune takes them.
	InUse []*storage.Manifest
	// Kept are those retention keeps, with the rules that keep them.
	Kept []Decision
}

// Prune applies r.Policy to its target's backups in one location.
func (p *Pruner) Prune(ctx context.Context, r Request) (Result, error) {
	var res Result
	loc := r.Location.Name
	// Delta segments and kits are not backups: they go only with their
	// backup.
	backups, parts := storage.SplitParts(r.Manifests)
	now := p.Now()
	for _, d := range Plan(backups, r.Policy, now) {
		if d.Keep {
			res.Kept = append(res.Kept, d)
			continue
		}
		m := d.Manifest
		if until := storage.LockedUntil(m, parts); until.After(now) {
			// The store would refuse (the backup's objects or its parts'):
			// kept, and said so, never a prune that fails half-way.
			res.Kept = append(res.Kept, locked(d, until))
			continue
		}
		restores, err := p.InUse.RestoresReading(ctx, loc, m.Name, "removing")
		if err != nil {
			return res, err
		}
		if len(restores) > 0 {
			res.InUse = append(res.InUse, m)
			continue
		}
		if r.DryRun {
			res.Pruned = append(res.Pruned, m)
			continue
		}
		done, ok, err := p.InUse.remove(ctx, loc, m.Name)
		if err != nil {
			return res, err
		}
		if !ok {
			res.InUse = append(res.InUse, m)
			continue
		}
		err = r.Location.Delete(ctx, m.Name)
		done()
		if errors.Is(err, storage.ErrNotFound) {
			continue // someone else removed it
		}
		if le := (*storage.LockedError)(nil); errors.As(err, &le) {
			// Locked longer than its manifest says (an operator extended
			// the retention in the store).
			res.Kept = append(res.Kept, locked(d, le.Until))
			continue
		}
		if err != nil {
			return res, &domain.StorageError{Location: loc, Name: m.Name, Err: err}
		}
		p.InUse.Removed(ctx, loc, m.Name, p.Log)
		if n, err := storage.DeleteParts(ctx, r.Location, parts, m.Name); err != nil {
			p.Log.Warn("removing the delta chain and recovery kit of a removed backup", "location", loc, "backup", m.Name, "removed", n, "error", err)
		}
		p.Metrics.Pruned.WithLabelValues(r.Policy.Target, loc).Inc()
		p.Log.Info("backup removed by retention", "location", loc, "backup", m.Name, "target", r.Policy.Target, "rule", d.Rules[0], "caller", r.By)
		r.Location.Note(ctx, p.Log, ledger.Entry{Action: ledger.ActionPrune, Backup: m.Name, SHA256: m.SHA256, Who: r.By,
			Detail: "retention of target " + r.Policy.Target + ": " + d.Rules[0]})
		res.Pruned = append(res.Pruned, m)
	}
	return res, nil
}

// locked is d kept because the store's object lock keeps it until until.
func locked(d Decision, until time.Time) Decision {
	d.Keep, d.Rules = true, []string{"locked until " + until.UTC().Format(time.RFC3339) + " (object lock; removed by a prune after that)"}
	return d
}
