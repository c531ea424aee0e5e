package server

import (
	"cmp"
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// DefaultPollInterval is how often the server looks at its agent Jobs and
// schedules when no scheduled time comes sooner.
const DefaultPollInterval = 10 * time.Second

// scheduledTarget is one target's schedule and what it has done.
type scheduledTarget struct {
	target   config.Target
	sched    *schedule.Schedule
	deadline time.Duration
	// last is the latest scheduled time already handled: started, found
	// started by an earlier server, or skipped.
	last time.Time
}

// watcher is the state of Serve's background loop.
type watcher struct {
	targets []*scheduledTarget
	// ready: the schedules know what an earlier server did (the first
	// look at storage and Jobs succeeded).
	ready bool
	// counted holds finished Jobs counted by this process, in case
	// marking them (jobs.AnnotationCounted) failed.
	counted map[string]bool
}

// watch is the server's scheduler and run observer, owned by Serve: each
// round it counts agent runs that finished (metrics, then retention after
// a scheduled one) and starts the scheduled backups that are due, until
// ctx ends.
func (s *Server) watch(ctx context.Context) {
	w := s.newWatcher()
	if w == nil {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		s.round(ctx, w)
		timer.Reset(s.untilNext(w))
	}
}

// newWatcher parses the schedules and sets up their metrics; nil when
// this server launches no agents, so has nothing to watch.
func (s *Server) newWatcher() *watcher {
	w := &watcher{counted: map[string]bool{}}
	for _, t := range s.targets {
		if t.Schedule == "" {
			continue
		}
		sched, err := schedule.Parse(t.Schedule, t.TimeZone)
		if err != nil { // config.ValidateTargets checked it
			s.log.Error("target schedule", "target", t.Name, "error", err)
			continue
		}
		period := sched.Period(s.now())
		deadline := period
		if t.StartingDeadline != nil {
			deadline = t.StartingDeadline.Duration
		}
		s.metrics.Period.WithLabelValues(t.Name).Set(period.Seconds())
		s.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipRunning)
		s.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipMissed)
		w.targets = append(w.targets, &scheduledTarget{target: t, sched: sched, deadline: deadline})
	}
	if s.agents == nil {
		if len(w.targets) > 0 {
			s.log.Warn("targets have schedules but this server launches no agents (agents.image is not set): no scheduled backups")
		}
		return nil
	}
	// Series an alert reads exist from the start, at zero.
	for _, t := range s.targets {
		loc := cmp.Or(t.Location, s.order[0])
		for _, r := range []string{metrics.ResultSucceeded, metrics.ResultFailed} {
			s.metrics.Runs.WithLabelValues(t.Name, loc, r)
		}
	}
	return w
}

// untilNext is how long the loop sleeps: until the next scheduled time,
// at most the poll interval.
func (s *Server) untilNext(w *watcher) time.Duration {
	now := s.now()
	d := s.pollInterval
	if !w.ready {
		return d
	}
	for _, st := range w.targets {
		// A little after, so the scheduled time is in the past by then.
		if next := st.sched.Next(st.last).Sub(now) + 100*time.Millisecond; next < d {
			d = max(next, 0)
		}
	}
	return d
}

// round is one pass of the loop.
func (s *Server) round(ctx context.Context, w *watcher) {
	runs, err := s.agents.List(ctx)
	if err != nil {
		s.log.Warn("scheduler: list backup agents", "error", err)
		return
	}
	if !w.ready {
		if err := s.recall(ctx, w, runs); err != nil {
			s.log.Warn("scheduler: read what earlier runs did (retrying)", "error", err)
			return
		}
		w.ready = true
	}
	s.observe(ctx, w, runs)
	now := s.now()
	for _, st := range w.targets {
		due, ok := st.sched.Latest(st.last, now)
		if !ok {
			continue
		}
		st.last = due
		s.startScheduled(ctx, st, due, now, runs)
	}
}

// recall sets each schedule's last handled time from what earlier servers
// did — scheduled backups in storage and scheduled agent Jobs — and the
// last-success metric from the newest stored agent backup of each target.
// A target with no scheduled backup at all starts from now: its first run
// is at its next scheduled time.
func (s *Server) recall(ctx context.Context, w *watcher, runs []jobs.Run) error {
	now := s.now()
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
	for _, locName := range s.order {
		manifests, err := s.locations[locName].List(ctx)
		if err != nil {
			s.metrics.StorageErrors.WithLabelValues(locName, "list").Inc()
			return err
		}
		for _, m := range manifests {
			if m.Labels[retention.LabelScheduled] == "true" {
				note(m.Labels[retention.LabelTarget], m.Name)
			}
			if m.Source.Kind == storage.SourceAgent && m.Source.Target != "" {
				s.metrics.SetLastSuccess(m.Source.Target, locName, m.CreateTime)
			}
		}
	}
	for _, st := range w.targets {
		if st.last.IsZero() {
			st.last = now
			continue
		}
		s.log.Info("scheduler: resuming", "target", st.target.Name, "lastScheduled", st.last, "next", st.sched.Next(st.last))
	}
	return nil
}

// startScheduled starts target's backup scheduled at due, unless it is
// too late (later than startingDeadline: missed) or a backup of the
// target is running.
func (s *Server) startScheduled(ctx context.Context, st *scheduledTarget, due, now time.Time, runs []jobs.Run) {
	t := st.target
	name := schedule.Name(t.Name, due)
	if late := now.Sub(due); late > st.deadline {
		s.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipMissed).Inc()
		s.log.Warn("scheduled backup missed: its time passed more than startingDeadline ago (the server was down?)",
			"target", t.Name, "scheduled", due, "late", late.Round(time.Second), "startingDeadline", st.deadline, "next", st.sched.Next(now))
		return
	}
	for _, r := range runs {
		if r.Target == t.Name && r.Phase == jobs.PhaseRunning {
			s.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipRunning).Inc()
			s.log.Warn("scheduled backup skipped: a backup of the target is still running",
				"target", t.Name, "scheduled", due, "running", r.Name, "job", r.JobName, "next", st.sched.Next(now))
			return
		}
	}
	_, err := s.startBackup(ctx, &ebv1.CreateBackupRequest{
		Name: name, Target: t.Name,
		Labels: map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: t.Name},
	}, true, "scheduler")
	if status.Code(err) == codes.AlreadyExists {
		return // an earlier server started or stored it
	}
	if err != nil {
		s.metrics.Runs.WithLabelValues(t.Name, cmp.Or(t.Location, s.order[0]), metrics.ResultFailed).Inc()
		s.log.Error("scheduled backup could not start", "target", t.Name, "backup", name, "error", err)
	}
}

// observe counts the agent runs that finished since the last round, once
// each (the Job is then annotated, so a restarted server does not count
// it again), and applies retention after a successful scheduled one.
func (s *Server) observe(ctx context.Context, w *watcher, runs []jobs.Run) {
	for _, r := range runs {
		if r.Phase == jobs.PhaseRunning || r.Counted || w.counted[runKey(r)] {
			continue
		}
		loc, ok := s.locations[r.Location]
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
				s.log.Error("backup agent finished but its backup is not in storage", "backup", r.Name, "location", r.Location, "job", r.JobName)
			default:
				s.metrics.StorageErrors.WithLabelValues(r.Location, "stat").Inc()
				s.log.Warn("backup run: stat its backup (retrying)", "backup", r.Name, "location", r.Location, "error", err)
				continue
			}
		}
		if err := s.agents.MarkCounted(ctx, r.JobName); err != nil {
			// Counted all the same; only a restart could count it twice.
			s.log.Warn("backup run: mark its Job counted", "job", r.JobName, "error", err)
		}
		w.counted[runKey(r)] = true
		s.metrics.Runs.WithLabelValues(r.Target, r.Location, result).Inc()
		if result == metrics.ResultFailed {
			s.log.Warn("backup run failed", "backup", r.Name, "location", r.Location, "target", r.Target, "job", r.JobName, "message", r.Message)
			continue
		}
		if !r.FinishTime.IsZero() {
			s.metrics.Duration.WithLabelValues(r.Target).Observe(r.FinishTime.Sub(r.StartTime).Seconds())
		}
		s.metrics.Size.WithLabelValues(r.Target).Set(float64(m.Size))
		s.metrics.SetLastSuccess(r.Target, r.Location, m.CreateTime)
		if r.Scheduled {
			s.retain(ctx, r.Target, r.Location)
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

// retain applies target's retention to its scheduled backups in one
// location, after a scheduled backup there succeeded.
func (s *Server) retain(ctx context.Context, target, locName string) {
	t, err := s.target(target)
	if err != nil || t.Retention == nil {
		return
	}
	manifests, err := s.locations[locName].List(ctx)
	if err != nil {
		s.metrics.StorageErrors.WithLabelValues(locName, "list").Inc()
		s.log.Warn("retention: list backups", "location", locName, "target", target, "error", err)
		return
	}
	if _, _, err := s.prune(ctx, locName, manifests, *t, false, false, "retention"); err != nil {
		s.log.Warn("retention", "location", locName, "target", target, "error", err)
	}
}

// runKey tells one Job from a later one of the same name (a failed
// backup's Job is replaced when it is taken again).
func runKey(r jobs.Run) string { return r.JobName + "@" + r.StartTime.String() }
