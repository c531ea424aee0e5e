package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/schedule"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/work"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// deltaRound keeps one delta agent running per target with deltas, on
// the chain of the target's newest full backup: it starts one when none
// runs, replaces one still on an older chain, and when a chain ended
// (etcd compacted past the agent, a revision was missing) or there is no
// full backup to start from, starts a full backup, whose chain the next
// round starts.
func (c *Controller) deltaRound(ctx context.Context, ls *domain.Listings, runs []jobs.Run) {
	var deltaTargets []config.Target
	for _, t := range c.targets {
		if t.Deltas != nil {
			deltaTargets = append(deltaTargets, t)
			c.metrics.DeltaPeriod.WithLabelValues(t.Name).Set(t.Deltas.PeriodOrDefault().Seconds())
			c.metrics.ChainEnds.WithLabelValues(t.Name)
		}
	}
	if len(deltaTargets) == 0 {
		return
	}
	agents, err := c.agents.Deltas(ctx)
	if err != nil {
		c.log.Warn("delta agents: list their Jobs", "error", err)
		return
	}
	for _, t := range deltaTargets {
		if err := c.superviseDelta(ctx, ls, t, agents, runs); err != nil {
			c.log.Warn("delta agent", "target", t.Name, "error", err)
		}
	}
}

// superviseDelta keeps t's delta agent on the chain of its newest full
// backup (deltaRound).
func (c *Controller) superviseDelta(ctx context.Context, ls *domain.Listings, t config.Target, agents []jobs.DeltaRun, runs []jobs.Run) error {
	ch, err := c.newestChain(ctx, ls, t)
	if err != nil {
		return err
	}
	full, locName := ch.full, ch.location
	var ended string
	if full != nil {
		for _, m := range ch.segments {
			if m.Delta != nil && m.Delta.EndReason != "" {
				ended = m.Delta.EndReason
			}
		}
		if n := len(ch.segments); n > 0 {
			c.metrics.SetDeltaPosition(t.Name, ch.segments[n-1].Delta.LastTime)
		}
	}
	running := false
	for _, a := range agents {
		if a.Target != t.Name {
			continue
		}
		switch {
		case a.Phase == jobs.PhaseRunning && (full == nil || a.Chain != full.Name || ended != ""):
			// A newer full starts a new chain: the agent on the old one
			// stores what it holds and releases the Lease.
			c.log.Info("delta agent replaced: a newer full backup starts a new chain", "target", t.Name, "job", a.JobName, "chain", a.Chain)
			if err := c.agents.StopDelta(ctx, a.JobName); err != nil {
				return fmt.Errorf("stop delta agent %s: %w", a.JobName, err)
			}
		case a.Phase == jobs.PhaseRunning:
			running = true
		case a.ChainEnded != "" && full != nil && a.Chain == full.Name && ended == "":
			// The agent ended the chain but storage does not say so (the
			// end could not be stored): the agent started below meets the
			// same end and stores it.
			c.log.Warn("delta agent ended its chain, which storage does not record yet; a new agent stores the end", "target", t.Name, "job", a.JobName,
				"chain", a.Chain, "reason", a.ChainEnded)
		}
	}
	if running {
		return nil
	}
	// A chain's end is what storage says (its last segment's reason),
	// not the agent's exit: an agent that ended its chain but could not
	// store the end is started again, finds etcd compacted past it again,
	// and stores it then.
	if full == nil || ended != "" {
		if ended != "" {
			c.log.Warn("delta chain ended; a full backup starts a new one", "target", t.Name, "chain", full.Name, "reason", ended)
		}
		return c.startChainBase(ctx, t, locName, runs, ended)
	}
	_, err = c.agents.StartDelta(ctx, jobs.DeltaSpec{
		Target: t, Chain: full.Name, Location: locName, FromRevision: full.Etcd.Revision,
		Compression: cmp.Or(ebv1.CompressionFromName(t.Compression), ebv1.CompressionZstd), AgeRecipients: t.AgeRecipients(),
		Period: t.Deltas.PeriodOrDefault(), MaxBytes: t.Deltas.MaxBytesOrDefault(),
	})
	if errors.Is(err, jobs.ErrRunning) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("start delta agent on chain %q: %w", full.Name, err)
	}
	c.log.Info("delta agent started", "target", t.Name, "chain", full.Name, "fromRevision", full.Etcd.Revision)
	return nil
}

// chain is a target's newest chain as stored: the location it is in,
// the full backup it starts from (nil: none yet) and the segments that
// name that full, in revision order, contiguous or not.
type chain struct {
	location string
	full     *storage.Manifest
	segments []*storage.Manifest
}

// newestChain reads t's newest chain from its location's listing (ls: the
// round's, shared by the delta supervisor and the folds).
func (c *Controller) newestChain(ctx context.Context, ls *domain.Listings, t config.Target) (chain, error) {
	ch := chain{location: c.locations.OfTarget(t)}
	loc, ok := c.locations.Lookup(ch.location)
	if !ok { // config.ValidateTargets names only configured locations
		return ch, fmt.Errorf("location %q is not configured", ch.location)
	}
	all, err := ls.List(ctx, loc)
	if err != nil {
		return ch, fmt.Errorf("list backups: %w", err)
	}
	backups, segments := storage.SplitParts(all)
	if ch.full = storage.NewestChainBase(backups, t.Name); ch.full != nil {
		ch.segments = storage.Chains(segments)[ch.full.Name]
	}
	return ch, nil
}

// startChainBase starts a full backup of t to start a new chain from,
// unless a backup of t is running already (its chain starts when it is
// stored).
func (c *Controller) startChainBase(ctx context.Context, t config.Target, locName string, runs []jobs.Run, why string) error {
	for _, r := range runs {
		if r.Target == t.Name && r.Phase == jobs.PhaseRunning {
			return nil
		}
	}
	name := schedule.ChainName(t.Name, c.now())
	if why == "" {
		why = "no full backup of the target to start a chain from"
	}
	_, err := c.work.StartBackup(ctx, work.BackupRequest{Name: name, Location: locName, Target: t.Name, ChainBase: true, By: "delta capture (" + why + ")"})
	if err != nil {
		return fmt.Errorf("start full backup %q for a new delta chain: %w", name, err)
	}
	c.log.Info("full backup started for a new delta chain", "target", t.Name, "backup", name, "reason", why)
	return nil
}
