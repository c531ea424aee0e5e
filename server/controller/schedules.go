package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// recall sets each schedule's last handled time from what earlier servers
// did — scheduled backups in storage and scheduled agent Jobs — and the
// last-success metric from the newest stored agent backup of each target.
// A target with no scheduled backup at all starts from now: its first run
// is at its next scheduled time.
func (c *Controller) recall(ctx context.Context, ls *domain.Listings, w *watcher, runs []jobs.Run) error {
	now := c.now()
	for _, st := range w.targets {
		st.last = time.Time{}
	}
	// note takes t as target's last handled time, unless it lies ahead
	// of now: a backup or Job whose scheduled time is still to come
	// (a name someone chose, a clock that was wrong) does not make the
	// schedule pass over the runs until then.
	note := func(target string, t time.Time) {
		if t.After(now) {
			c.log.Warn("scheduler: a scheduled backup's time is in the future; not taken as the last run",
				"target", target, "scheduled", t, "now", now)
			return
		}
		for _, st := range w.targets {
			if st.target.Name == target && t.After(st.last) {
				st.last = t
			}
		}
	}
	for _, r := range runs {
		if !r.Scheduled {
			continue
		}
		if t, ok := schedule.TimeOf(r.Target, r.Name); ok {
			note(r.Target, t)
		}
	}
	for _, loc := range c.locations.All() {
		locName := loc.Name
		manifests, err := ls.List(ctx, loc)
		if err != nil {
			return err
		}
		manifests, _ = storage.SplitParts(manifests)
		for _, m := range manifests {
			if target, ok := retention.ScheduledOf(m); ok {
				t := m.Source.ScheduledTime
				if t.IsZero() { // stored before the source had the time
					t, ok = schedule.TimeOf(target, m.Name)
				}
				if ok {
					note(target, t)
				}
			}
			if m.Source.Kind == ebv1.SourceAgent && m.Source.Target != "" {
				c.metrics.SetLastSuccess(m.Source.Target, locName, m.CreateTime)
			}
			c.recallVerified(m, locName)
		}
	}
	for _, st := range w.targets {
		if st.last.IsZero() {
			st.last = now
			continue
		}
		c.log.Info("scheduler: resuming", "target", st.target.Name, "lastScheduled", st.last, "next", st.sched.Next(st.last))
	}
	return nil
}

// startScheduled starts target's backup scheduled at due, unless it is
// too late (later than startingDeadline: missed) or a backup of the
// target is running.
func (c *Controller) startScheduled(ctx context.Context, st *scheduledTarget, due, now time.Time, runs []jobs.Run) {
	t := st.target
	name := schedule.Name(t.Name, due)
	if late := now.Sub(due); late > st.deadline {
		c.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipMissed).Inc()
		c.log.Warn("scheduled backup missed: its time passed more than startingDeadline ago (the server was down?)",
			"target", t.Name, "scheduled", due, "late", late.Round(time.Second), "startingDeadline", st.deadline, "next", st.sched.Next(now))
		return
	}
	for _, r := range runs {
		if r.Target == t.Name && r.Phase == jobs.PhaseRunning {
			c.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipRunning).Inc()
			c.log.Warn("scheduled backup skipped: a backup of the target is still running",
				"target", t.Name, "scheduled", due, "running", r.Name, "job", r.JobName, "next", st.sched.Next(now))
			return
		}
	}
	// No labels: that the backup is scheduled is the Job's (signed)
	// label, which the server writes into the manifest's source.
	loc := c.locations.OfTarget(t)
	start := func(name string) error {
		_, err := c.work.StartBackup(ctx, work.BackupRequest{Name: name, Target: t.Name, Scheduled: true, By: "scheduler"})
		return err
	}
	err := start(name)
	// A name that is not the schedule's (stored before users could not
	// take such names): the run still backs up, under the next free
	// alternative, and says so.
	taken := name
	for i := 2; nameInUse(err) && i <= maxAltNames; i++ {
		if c.ownScheduled(ctx, t.Name, loc, name) {
			return // an earlier server started or stored it
		}
		name = schedule.AltName(t.Name, due, i)
		err = start(name)
	}
	if nameInUse(err) && c.ownScheduled(ctx, t.Name, loc, name) {
		return
	}
	if name != taken {
		c.nameTaken(ctx, st, due, now, taken, name, err)
		return
	}
	if err != nil {
		c.metrics.Runs.WithLabelValues(t.Name, loc, metrics.ResultFailed).Inc()
		c.log.Error("scheduled backup could not start", "target", t.Name, "backup", name, "error", err)
	}
}

// ownScheduled says whether the backup stored as name in location loc is
// target's scheduled backup (an earlier server's run), rather than one
// that took its name.
func (c *Controller) ownScheduled(ctx context.Context, target, loc, name string) bool {
	l, ok := c.locations.Lookup(loc)
	if !ok {
		return false
	}
	m, err := l.Stat(ctx, name)
	if err != nil {
		return false
	}
	got, ok := retention.ScheduledOf(m)
	return ok && got == target
}

// nameInUse says a backup could not start because its name is taken:
// stored, or an agent takes it now.
func nameInUse(err error) bool {
	return errors.Is(err, storage.ErrAlreadyExists) || errors.Is(err, domain.ErrAlreadyRunning)
}

// maxAltNames bounds the alternative names a scheduled run tries when
// its own is taken (NAME-2 … NAME-4).
const maxAltNames = 4

// nameTaken reports a scheduled run whose name another backup holds (an
// upload or on-demand backup named so before such names were refused):
// a log line, the name-taken counter and an Event on the server's pod.
// The run went on as alt, unless err says it could not (all taken: the
// failed-run counter too).
func (c *Controller) nameTaken(ctx context.Context, st *scheduledTarget, due, now time.Time, name, alt string, err error) {
	t := st.target
	loc := c.locations.OfTarget(t)
	c.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipNameTaken).Inc()
	msg := fmt.Sprintf("scheduled backup %q of target %q (due %s): a backup that is not this schedule's has the name in location %q; the run is stored as %q instead. Rename or delete %q",
		name, t.Name, due.UTC().Format(time.RFC3339), loc, alt, name)
	if err != nil {
		c.metrics.Runs.WithLabelValues(t.Name, loc, metrics.ResultFailed).Inc()
		msg = fmt.Sprintf("scheduled backup %q of target %q (due %s) was not taken: backups that are not this schedule's hold its name and its alternatives up to %q in location %q; rename or delete them. The next run is at %s",
			name, t.Name, due.UTC().Format(time.RFC3339), alt, loc, st.sched.Next(now).UTC().Format(time.RFC3339))
		c.log.Error("scheduled backup failed: its names are taken", "target", t.Name, "backup", name, "location", loc, "scheduled", due, "next", st.sched.Next(now))
	} else {
		c.log.Warn("scheduled backup's name is taken: stored under another", "target", t.Name, "backup", name, "storedAs", alt, "location", loc, "scheduled", due)
	}
	if c.agents == nil {
		return
	}
	if err := c.agents.ServerEvent(ctx, EventNameTaken, msg); err != nil {
		c.log.Warn("scheduler: no Event for the run whose name was taken", "target", t.Name, "backup", name, "error", err)
	}
}

// EventNameTaken is the reason of the Event a scheduled run whose name
// was taken records.
const EventNameTaken = "ScheduledBackupNameTaken"
