package controller

import (
	"cmp"
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// recall sets each schedule's last handled time from what earlier servers
// did — scheduled backups in storage and scheduled agent Jobs — and the
// last-success metric from the newest stored agent backup of each target.
// A target with no scheduled backup at all starts from now: its first run
// is at its next scheduled time.
func (c *Controller) recall(ctx context.Context, w *watcher, runs []jobs.Run) error {
	now := c.now()
	for _, st := range w.targets {
		st.last = time.Time{}
	}
	note := func(target, name string) {
		for _, st := range w.targets {
			if st.target.Name != target {
				continue
			}
			if t, ok := schedule.TimeOf(target, name); ok && t.After(st.last) {
				st.last = t
			}
		}
	}
	for _, r := range runs {
		if r.Scheduled {
			note(r.Target, r.Name)
		}
	}
	for _, locName := range c.order {
		manifests, err := c.locations[locName].List(ctx)
		if err != nil {
			c.metrics.StorageErrors.WithLabelValues(locName, "list").Inc()
			return err
		}
		for _, m := range manifests {
			if m.Labels[retention.LabelScheduled] == "true" {
				note(m.Labels[retention.LabelTarget], m.Name)
			}
			if m.Source.Kind == storage.SourceAgent && m.Source.Target != "" {
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
	_, err := c.startBackup(ctx, &ebv1.CreateBackupRequest{
		Name: name, Target: t.Name,
		Labels: map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: t.Name},
	}, true, "scheduler")
	if status.Code(err) == codes.AlreadyExists {
		return // an earlier server started or stored it
	}
	if err != nil {
		c.metrics.Runs.WithLabelValues(t.Name, cmp.Or(t.Location, c.order[0]), metrics.ResultFailed).Inc()
		c.log.Error("scheduled backup could not start", "target", t.Name, "backup", name, "error", err)
	}
}
