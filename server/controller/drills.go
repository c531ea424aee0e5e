package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// drillTarget is one target's drill schedule and the latest drill time
// handled.
type drillTarget struct {
	target config.Target
	sched  *schedule.Schedule
	last   time.Time
}

// newDrills parses the targets' drill schedules; the first drill of each
// is at its next scheduled time after the server starts.
func (c *Controller) newDrills(now time.Time) []*drillTarget {
	var out []*drillTarget
	for _, t := range c.targets {
		if t.Drill == nil {
			continue
		}
		sched, err := schedule.Parse(t.Drill.Schedule, t.Drill.TimeZone)
		if err != nil { // config validation checked it
			c.log.Error("target drill schedule", "target", t.Name, "error", err)
			continue
		}
		loc := c.locations.OfTarget(t)
		for _, r := range []string{metrics.DrillSucceeded, metrics.DrillFailed, metrics.DrillError} {
			c.metrics.DrillRuns.WithLabelValues(t.Name, r)
		}
		c.metrics.LastVerified.WithLabelValues(t.Name, loc)
		within := 3 * sched.Period(now)
		if t.Drill.VerifiedWithin != nil {
			within = t.Drill.VerifiedWithin.Duration
		}
		c.metrics.VerifiedWithin.WithLabelValues(t.Name).Set(within.Seconds())
		out = append(out, &drillTarget{target: t, sched: sched, last: now})
	}
	return out
}

// recallVerified sets the last-verified metric from what storage holds.
func (c *Controller) recallVerified(m *storage.Manifest, loc string) {
	if retention.Verified(m) && m.OfTarget(m.Source.Target) {
		c.metrics.SetLastVerified(m.Source.Target, loc, m.CreateTime)
	}
}

// drillRound records the verdicts of drills that finished and starts
// the drills that are due.
func (c *Controller) drillRound(ctx context.Context, ls *domain.Listings, w *watcher, now time.Time) {
	// From the cache: on-demand drills are recorded too, with or without
	// drill schedules.
	drills, err := c.agents.Drills(ctx)
	if err != nil {
		c.log.Warn("drills: list drill agents", "error", err)
		return
	}
	c.recordDrills(ctx, ls, w, drills)
	for _, dt := range w.drills {
		due, ok := dt.sched.Latest(dt.last, now)
		if !ok {
			continue
		}
		dt.last = due
		c.startScheduledDrill(ctx, ls, dt, drills)
	}
}

// startScheduledDrill drills the newest stored backup of the target that
// records a keyspace fingerprint, unless a drill of the target runs.
func (c *Controller) startScheduledDrill(ctx context.Context, ls *domain.Listings, dt *drillTarget, drills []jobs.DrillRun) {
	t := dt.target
	for _, d := range drills {
		if d.Target == t.Name && d.Phase == jobs.PhaseRunning {
			c.log.Warn("scheduled drill skipped: a drill of the target is still running", "target", t.Name, "running", d.Backup, "job", d.JobName)
			return
		}
	}
	locName := c.locations.OfTarget(t)
	loc, ok := c.locations.Lookup(locName)
	if !ok {
		return
	}
	manifests, err := ls.List(ctx, loc)
	if err != nil {
		c.log.Warn("scheduled drill: list backups", "target", t.Name, "location", locName, "error", err)
		return
	}
	var newest *storage.Manifest
	manifests, _ = storage.SplitParts(manifests)
	for _, m := range manifests {
		if !m.OfTarget(t.Name) || m.Etcd == nil || !m.Etcd.Keyspace {
			continue
		}
		if newest == nil || ebv1.CompareListing(m.CreateTime, m.Name, newest.CreateTime, newest.Name) < 0 {
			newest = m
		}
	}
	if newest == nil {
		c.log.Warn("scheduled drill: the target has no stored backup that records a keyspace fingerprint yet", "target", t.Name, "location", locName)
		return
	}
	_, err = c.work.StartDrill(ctx, work.DrillRequest{Location: locName, Name: newest.Name, Scheduled: true, By: "drill schedule"})
	if errors.Is(err, domain.ErrAlreadyRunning) {
		return
	}
	if err != nil {
		c.metrics.DrillRuns.WithLabelValues(t.Name, metrics.DrillError).Inc()
		c.log.Error("scheduled drill could not start", "target", t.Name, "backup", newest.Name, "error", err)
	}
	if errors.Is(err, jobs.ErrIdentitySecret) {
		c.recordNotStarted(ctx, loc, newest, err)
		ls.Forget(locName)
	}
}

// recordNotStarted records, as the backup's verification, that its
// scheduled drill could not start for a reason of the configuration
// (err): an Error, not Failed — nothing was learned about the backup —
// shown by list and describe as a drill's verdict is. A backup a drill
// already verified keeps that verdict: a Secret deleted since says
// nothing against it.
func (c *Controller) recordNotStarted(ctx context.Context, loc storage.Location, m *storage.Manifest, err error) {
	if retention.Verified(m) {
		return
	}
	v := &storage.Verification{Time: c.now().UTC(), Result: storage.VerificationError, Message: err.Error()}
	if err := setVerification(ctx, loc, m.Name, v); err != nil {
		c.log.Warn("scheduled drill: record that it could not start", "backup", m.Name, "error", err)
	}
}

// recordDrills writes the verdict of every drill that finished into its
// backup's manifest, once (the Job is then marked counted).
func (c *Controller) recordDrills(ctx context.Context, ls *domain.Listings, w *watcher, drills []jobs.DrillRun) {
	for _, d := range drills {
		if d.Phase == jobs.PhaseRunning || d.Counted || w.counted[d.JobName] {
			continue
		}
		loc, ok := c.locations.Lookup(d.Location)
		if !ok {
			continue
		}
		v := verification(d, c.now())
		if v.Result == storage.VerificationError {
			// A drill that could not fetch the backup: the server tells
			// a backup whose stored data cannot be read as recorded
			// (a verdict) from one removed meanwhile.
			if msg := unreadableData(ctx, loc, d, v.Message); msg != "" {
				v.Result, v.Message = storage.VerificationFailed, msg
			}
		}
		var err error
		if keep := c.verifiedBefore(ctx, loc, d, v); !keep {
			err = setVerification(ctx, loc, d.Backup, v)
			ls.Forget(d.Location) // the manifest changed
		}
		switch {
		case errors.Is(err, storage.ErrNotFound):
			c.log.Info("drill finished after its backup was removed", "backup", d.Backup, "location", d.Location, "job", d.JobName)
		case err != nil:
			c.log.Warn("drill: record its verdict (retrying)", "backup", d.Backup, "location", d.Location, "error", err)
			continue
		}
		if err := c.agents.MarkCounted(ctx, d.JobName); err != nil {
			c.log.Warn("drill: mark its Job counted", "job", d.JobName, "error", err)
		}
		w.counted[d.JobName] = true
		result := map[string]string{
			storage.VerificationSucceeded: metrics.DrillSucceeded, storage.VerificationFailed: metrics.DrillFailed,
		}[v.Result]
		if d.Target != "" { // a drill of an upload is no target's
			c.metrics.DrillRuns.WithLabelValues(d.Target, cmp.Or(result, metrics.DrillError)).Inc()
		}
		if v.Result != storage.VerificationSucceeded {
			c.log.Warn("drill failed", "backup", d.Backup, "location", d.Location, "target", d.Target, "result", v.Result, "message", v.Message)
			if err == nil && v.Result == storage.VerificationFailed && d.Target != "" {
				// A backup verified before may have lost that status:
				// the metric says the newest backup still verified.
				c.resetLastVerified(ctx, ls, loc, d.Target)
			}
			continue
		}
		c.log.Info("drill succeeded", "backup", d.Backup, "location", d.Location, "target", d.Target, "revision", v.Revision, "keys", v.Keys)
		if err == nil && d.Target != "" {
			if m, err := loc.Stat(ctx, d.Backup); err == nil && m.OfTarget(d.Target) {
				c.metrics.SetLastVerified(d.Target, d.Location, m.CreateTime)
			}
			// The backup retention kept as the newest verified one may
			// now go.
			c.retain(ctx, ls, d.Target, d.Location)
		}
	}
}

// unreadableData returns the Failed message for drill d, which reached no
// verdict because it could not fetch the backup (message), when the
// backup's manifest is still stored — the one the drill was pinned to —
// but its data cannot be opened: missing, or not the object stored with
// the manifest (S3 reads the data with If-Match on the ETag recorded
// with it, so data replaced or altered in the bucket is refused). ""
// when the data opens or the backup is gone: then nothing was learned.
func unreadableData(ctx context.Context, loc storage.Location, d jobs.DrillRun, message string) string {
	m, err := loc.Stat(ctx, d.Backup)
	if err != nil || (d.SHA256 != "" && m.SHA256 != d.SHA256) {
		return ""
	}
	r, _, err := loc.Open(ctx, d.Backup, 0, min(1, m.Size))
	if err == nil {
		r.Close()
		return ""
	}
	if !errors.Is(err, storage.ErrNotFound) {
		return ""
	}
	if _, serr := loc.Stat(ctx, d.Backup); serr != nil {
		return "" // removed meanwhile
	}
	return fmt.Sprintf("the backup cannot be read back as it was stored: its manifest is stored but its data is missing or is not the data stored with it "+
		"(replaced or altered in storage since the upload; in S3 the object's ETag is not the one recorded), so its stored SHA-256 cannot be checked (the drill: %s); "+
		"do not restore it: take a new backup, drill it, and find out what changed this one (the storage's access logs)", message)
}

// resetLastVerified sets the target's last-verified metric in the
// location to its newest backup whose newest drill succeeded (0: none),
// after a drill failed one that may have been it.
func (c *Controller) resetLastVerified(ctx context.Context, ls *domain.Listings, loc *domain.Location, target string) {
	if target == "" {
		return
	}
	locName := loc.Name
	manifests, err := ls.List(ctx, loc)
	if err != nil {
		c.log.Warn("drill: list backups to find the newest verified one", "location", locName, "target", target, "error", err)
		return
	}
	var newest time.Time
	for _, m := range manifests {
		if m.OfTarget(target) && retention.Verified(m) && m.CreateTime.After(newest) {
			newest = m.CreateTime
		}
	}
	v := 0.0
	if !newest.IsZero() {
		v = float64(newest.UnixNano()) / 1e9
	}
	c.metrics.LastVerified.WithLabelValues(target, locName).Set(v)
}

// verifiedBefore: drill d reached no verdict (v is an Error) on a backup
// an earlier drill verified. Its verification stays: a drill that
// learned nothing says nothing against the backup, and retention keeps
// the newest verified backup by it. The metric and the log still count
// the error.
func (c *Controller) verifiedBefore(ctx context.Context, loc storage.Location, d jobs.DrillRun, v *storage.Verification) bool {
	if v.Result != storage.VerificationError {
		return false
	}
	m, err := loc.Stat(ctx, d.Backup)
	if err != nil || !retention.Verified(m) {
		return false
	}
	c.log.Warn("drill reached no verdict; the backup keeps its earlier verification", "backup", d.Backup, "location", d.Location,
		"job", d.JobName, "message", v.Message)
	return true
}

// verification is the verdict of finished drill d: the agent's own, or,
// when it wrote none, an error saying why nothing was learned.
func verification(d jobs.DrillRun, now time.Time) *storage.Verification {
	v := &storage.Verification{Time: cmp.Or(d.FinishTime, now).UTC(), Job: d.JobName}
	if a := d.Verdict; a != nil {
		v.Revision, v.Keys, v.HashKV, v.Duration, v.Message = a.Revision, a.Keys, a.HashKV, a.Duration, a.Message
		switch {
		case a.NoVerdict:
			v.Result = storage.VerificationError
		case a.Succeeded:
			v.Result = storage.VerificationSucceeded
		default:
			v.Result = storage.VerificationFailed
		}
		return v
	}
	v.Result = storage.VerificationError
	v.Message = fmt.Sprintf("the drill reached no verdict: its agent ended without one (%s); nothing was learned about the backup: see `kubectl etcdbackup describe` events of Job %s, or drill it again",
		cmp.Or(d.Message, "no reason given"), d.JobName)
	if d.Phase == jobs.PhaseSucceeded {
		v.Message = "the drill agent finished without writing a verdict; nothing was learned about the backup: drill it again"
	}
	return v
}

func setVerification(ctx context.Context, loc storage.Location, name string, v *storage.Verification) error {
	w, ok := loc.(storage.VerificationWriter)
	if !ok {
		return fmt.Errorf("the location cannot record a drill's verdict")
	}
	return w.SetVerification(ctx, name, v)
}

// nextDrill is when the earliest drill schedule fires next (zero: none).
func nextDrill(w *watcher) time.Time {
	var next time.Time
	for _, dt := range w.drills {
		if n := dt.sched.Next(dt.last); next.IsZero() || n.Before(next) {
			next = n
		}
	}
	return next
}
