// Package controller is the data server's background loop, the work it
// does on its own, not on request: it starts each target's scheduled
// backups when they are due, observes the agent runs that finished
// (metrics, the counted annotation on their Job) and applies retention
// after a successful scheduled one; it starts scheduled restore drills
// and records every drill's verdict; it keeps a delta agent on each
// delta target's newest chain and folds long chains into new full
// backups. It starts work through server/work, as the request layer
// does, and decides on the domain's errors (server/domain).
package controller

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/metrics"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
)

// DefaultPollInterval is how often the controller runs a round when no
// scheduled time comes sooner.
const DefaultPollInterval = 10 * time.Second

// Config is what a Controller needs.
type Config struct {
	// Locations are the server's storage locations (shared with the
	// request layer).
	Locations *domain.Locations
	// Targets are the etcd clusters; those with a schedule are backed up
	// on it.
	Targets []config.Target
	// Agents launches and lists agent Jobs; nil means there is nothing
	// to watch and Run returns at once.
	Agents  *jobs.Launcher
	Metrics *metrics.Metrics
	// Pruner applies retention after a successful scheduled run.
	Pruner *retention.Pruner
	// Work starts scheduled backups and drills, and the full backups
	// new delta chains start from.
	Work *work.Starter
	// Logger nil logs nothing; Now nil is time.Now.
	Logger *slog.Logger
	Now    func() time.Time
	// PollInterval is how often Run looks at agent Jobs and schedules
	// when no scheduled time comes sooner; 0 means DefaultPollInterval.
	PollInterval time.Duration
}

// Controller runs the server's background loop (Run).
type Controller struct {
	locations    *domain.Locations
	targets      domain.Targets
	agents       *jobs.Launcher
	metrics      *metrics.Metrics
	pruner       *retention.Pruner
	work         *work.Starter
	log          *slog.Logger
	now          func() time.Time
	pollInterval time.Duration
}

// New returns the Controller cfg describes.
func New(cfg Config) *Controller {
	c := &Controller{
		locations:    cfg.Locations,
		targets:      cfg.Targets,
		agents:       cfg.Agents,
		metrics:      cfg.Metrics,
		pruner:       cfg.Pruner,
		work:         cfg.Work,
		log:          cfg.Logger,
		now:          cfg.Now,
		pollInterval: cmp.Or(cfg.PollInterval, DefaultPollInterval),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// scheduledTarget is one target's schedule and what it has done.
type scheduledTarget struct {
	target   config.Target
	sched    *schedule.Schedule
	deadline time.Duration
	// last is the latest scheduled time already handled: started, found
	// started by an earlier server, or skipped.
	last time.Time
}

// watcher is the state of Run's loop.
type watcher struct {
	targets []*scheduledTarget
	// ready: the schedules know what an earlier server did (the first
	// look at storage and Jobs succeeded).
	ready bool
	// counted holds finished Jobs counted by this process, in case
	// marking them (jobs.AnnotationCounted) failed.
	counted map[string]bool
	// drills are the targets' drill schedules.
	drills []*drillTarget
}

// Run is the server's background loop (server.Serve runs it on a
// goroutine of its own, on the elected replica): each round (round) it
// counts the agent runs that finished, starts the scheduled backups and
// drills that are due, and supervises the delta agents and chain folds,
// until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	w := c.newWatcher()
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
		c.round(ctx, w)
		timer.Reset(c.untilNext(w))
	}
}

// newWatcher parses the schedules and sets up their metrics; nil when
// this server launches no agents, so has nothing to watch.
func (c *Controller) newWatcher() *watcher {
	w := &watcher{counted: map[string]bool{}}
	for _, t := range c.targets {
		if t.Schedule == "" {
			continue
		}
		sched, err := schedule.Parse(t.Schedule, t.TimeZone)
		if err != nil { // config.ValidateTargets checked it
			c.log.Error("target schedule", "target", t.Name, "error", err)
			continue
		}
		period := sched.Period(c.now())
		deadline := period
		if t.StartingDeadline != nil {
			deadline = t.StartingDeadline.Duration
		}
		c.metrics.Period.WithLabelValues(t.Name).Set(period.Seconds())
		c.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipRunning)
		c.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipMissed)
		c.metrics.Skipped.WithLabelValues(t.Name, metrics.SkipNameTaken)
		w.targets = append(w.targets, &scheduledTarget{target: t, sched: sched, deadline: deadline})
	}
	if c.agents == nil {
		if len(w.targets) > 0 {
			c.log.Warn("targets have schedules but this server launches no agents (agents.image is not set): no scheduled backups")
		}
		return nil
	}
	w.drills = c.newDrills(c.now())
	// Series an alert reads exist from the start, at zero.
	for _, t := range c.targets {
		loc := c.locations.OfTarget(t)
		for _, r := range []string{metrics.ResultSucceeded, metrics.ResultFailed} {
			c.metrics.Runs.WithLabelValues(t.Name, loc, r)
		}
	}
	return w
}

// untilNext is how long the loop sleeps: until the next scheduled time,
// at most the poll interval.
func (c *Controller) untilNext(w *watcher) time.Duration {
	now := c.now()
	d := c.pollInterval
	if !w.ready {
		return d
	}
	for _, st := range w.targets {
		// A little after, so the scheduled time is in the past by then.
		if next := st.sched.Next(st.last).Sub(now) + 100*time.Millisecond; next < d {
			d = max(next, 0)
		}
	}
	if n := nextDrill(w); !n.IsZero() {
		if next := n.Sub(now) + 100*time.Millisecond; next < d {
			d = max(next, 0)
		}
	}
	return d
}

// round is one pass of the loop. Its parts share one listing of each
// location (domain.Listings), read again only after a part changed it.
func (c *Controller) round(ctx context.Context, w *watcher) {
	runs, err := c.agents.List(ctx)
	if err != nil {
		c.log.Warn("scheduler: list backup agents", "error", err)
		return
	}
	// One listing per location for the round, however many readers.
	ls := domain.NewListings()
	if !w.ready {
		if err := c.recall(ctx, ls, w, runs); err != nil {
			c.log.Warn("scheduler: read what earlier runs did (retrying)", "error", err)
			return
		}
		w.ready = true
	}
	c.observe(ctx, ls, w, runs)
	now := c.now()
	for _, st := range w.targets {
		due, ok := st.sched.Latest(st.last, now)
		if !ok {
			continue
		}
		st.last = due
		c.startScheduled(ctx, st, due, now, runs)
	}
	c.drillRound(ctx, ls, w, now)
	c.deltaRound(ctx, ls, runs)
	c.foldRound(ctx, ls, runs)
}
