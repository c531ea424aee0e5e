package controller

import (
	"context"
	"errors"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// observe counts the agent runs that finished since the last round, once
// each (the Job is then annotated, so a restarted server does not count
// it again), and applies retention after a successful scheduled one or
// a delta chain's new full.
func (c *Controller) observe(ctx context.Context, ls *domain.Listings, w *watcher, runs []jobs.Run) {
	for _, r := range runs {
		if r.Phase == jobs.PhaseRunning || r.Counted || w.counted[runKey(r)] {
			continue
		}
		loc, ok := c.locations.Lookup(r.Location)
		if !ok {
			continue // a location no longer configured
		}
		result := metrics.ResultFailed
		var m *storage.Manifest
		if r.Phase == jobs.PhaseSucceeded {
			var err error
			m, err = loc.Stat(ctx, r.Name)
			switch {
			case err == nil:
				result = metrics.ResultSucceeded
			case errors.Is(err, storage.ErrNotFound):
				c.log.Error("backup agent finished but its backup is not in storage", "backup", r.Name, "location", r.Location, "job", r.JobName)
			default:
				c.log.Warn("backup run: stat its backup (retrying)", "backup", r.Name, "location", r.Location, "error", err)
				continue
			}
		}
		if err := c.agents.MarkCounted(ctx, r.JobName); err != nil {
			// Counted all the same; only a restart could count it twice.
			c.log.Warn("backup run: mark its Job counted", "job", r.JobName, "error", err)
		}
		w.counted[runKey(r)] = true
		c.metrics.Runs.WithLabelValues(r.Target, r.Location, result).Inc()
		if result == metrics.ResultFailed {
			c.log.Warn("backup run failed", "backup", r.Name, "location", r.Location, "target", r.Target, "job", r.JobName, "message", r.Message)
			continue
		}
		if !r.FinishTime.IsZero() {
			c.metrics.Duration.WithLabelValues(r.Target).Observe(r.FinishTime.Sub(r.StartTime).Seconds())
		}
		c.metrics.Size.WithLabelValues(r.Target).Set(float64(m.Size))
		c.metrics.SetLastSuccess(r.Target, r.Location, m.CreateTime)
		// A scheduled run and a delta chain's new full are the server's
		// own backups: retention counts them, so it follows each.
		if r.Scheduled || retention.Automatic(m, r.Target) {
			c.retain(ctx, ls, r.Target, r.Location)
		}
	}
	// Forget Jobs the cluster no longer has (TTL after finishing).
	present := map[string]bool{}
	for _, r := range runs {
		present[runKey(r)] = true
	}
	for j := range w.counted {
		if !present[j] {
			delete(w.counted, j)
		}
	}
}

// retain applies target's retention to its backups in one location,
// after one of the server's own backups of it (scheduled, a chain base, a
// fold) was stored there.
func (c *Controller) retain(ctx context.Context, ls *domain.Listings, target, locName string) {
	t, err := c.targets.Get(target)
	if err != nil || t.Retention == nil {
		return
	}
	loc, ok := c.locations.Lookup(locName)
	if !ok {
		return
	}
	manifests, err := ls.List(ctx, loc)
	if err != nil {
		c.log.Warn("retention: list backups", "location", locName, "target", target, "error", err)
		return
	}
	res, err := c.pruner.Prune(ctx, retention.Request{
		Location: loc, Manifests: manifests, Policy: retention.PolicyOf(*t, false), By: "server (retention)",
	})
	if len(res.Pruned) > 0 || err != nil {
		ls.Forget(locName) // the listing no longer says what is stored
	}
	if err != nil {
		c.log.Warn("retention", "location", locName, "target", target, "error", err)
	}
}

// runKey tells one Job from a later one of the same name (a failed
// backup's Job is replaced when it is taken again).
func runKey(r jobs.Run) string { return r.JobName + "@" + r.StartTime.String() }
