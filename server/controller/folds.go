package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/domain"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// foldRetryAfter is how long after a fold of a chain failed the next one
// of that chain starts: a segment that does not replay fails every fold,
// and a fold downloads the whole chain.
const foldRetryAfter = 15 * time.Minute

// foldRound folds the newest chain of each target with
// deltas.compactAfterRevisions into a new full backup once it holds more
// revisions than that: one fold Job at a time per target. The delta
// supervisor then starts the next chain from the folded full, the newest
// agent backup of the target.
func (c *Controller) foldRound(ctx context.Context, ls *domain.Listings, runs []jobs.Run) {
	var targets []config.Target
	for _, t := range c.targets {
		if t.Deltas != nil && t.Deltas.CompactAfterRevisions > 0 {
			targets = append(targets, t)
		}
	}
	if len(targets) == 0 {
		return
	}
	folds, err := c.agents.Folds(ctx)
	if err != nil {
		c.log.Warn("chain folds: list their Jobs", "error", err)
		return
	}
	c.recordFolds(ctx, ls, folds)
	for _, t := range targets {
		if err := c.foldChain(ctx, ls, t, folds, runs); err != nil {
			c.log.Warn("chain fold", "target", t.Name, "error", err)
		}
	}
}

// recordFolds logs each finished fold once, and applies the target's
// retention after one stored its full.
func (c *Controller) recordFolds(ctx context.Context, ls *domain.Listings, folds []jobs.FoldRun) {
	for _, f := range folds {
		if f.Phase == jobs.PhaseRunning || f.Counted {
			continue
		}
		switch v := f.Verdict; {
		case v != nil && v.Succeeded:
			c.log.Info("delta chain folded into a new full backup", "target", f.Target, "chain", f.Chain, "backup", v.Backup,
				"revision", v.Revision, "revisions", v.Revisions, "keys", v.Keys, "hashKV", v.HashKV, "seconds", v.Duration.Seconds())
		case v != nil:
			c.log.Warn("delta chain fold failed; the chain stays as it is", "target", f.Target, "chain", f.Chain, "job", f.JobName, "message", v.Message)
		default:
			c.log.Warn("delta chain fold reached no verdict; the chain stays as it is", "target", f.Target, "chain", f.Chain, "job", f.JobName,
				"message", f.Message, "next", "kubectl -n NAMESPACE logs job/"+f.JobName)
		}
		if err := c.agents.MarkCounted(ctx, f.JobName); err != nil {
			c.log.Warn("chain folds: mark a finished fold", "job", f.JobName, "error", err)
		}
		if f.Verdict != nil && f.Verdict.Succeeded {
			c.retain(ctx, ls, f.Target, f.Location)
		}
	}
}

// foldChain starts the fold of t's newest chain when it is long enough
// and no fold of t runs.
func (c *Controller) foldChain(ctx context.Context, ls *domain.Listings, t config.Target, folds []jobs.FoldRun, runs []jobs.Run) error {
	for _, f := range folds {
		if f.Target == t.Name && f.Phase == jobs.PhaseRunning {
			return nil
		}
	}
	ch, err := c.newestChain(ctx, ls, t)
	if err != nil || ch.full == nil {
		return err
	}
	full, locName := ch.full, ch.location
	segs := storage.ContiguousSegments(full.Etcd.Revision, ch.segments)
	if len(segs) == 0 {
		return nil
	}
	last := segs[len(segs)-1].Delta.LastRevision
	if last-full.Etcd.Revision <= t.Deltas.CompactAfterRevisions {
		return nil
	}
	for _, f := range folds {
		if f.Target == t.Name && f.Chain == full.Name && f.Verdict != nil && !f.Verdict.Succeeded && c.now().Sub(f.FinishTime) < foldRetryAfter {
			return nil
		}
	}
	if len(segs) > jobs.MaxFoldSegments {
		// More than one Job's annotation can pin: a new full backup starts
		// a chain that is folded before it grows this long.
		return c.startChainBase(ctx, t, locName, runs,
			fmt.Sprintf("chain %s has %d segments, more than one fold reads (%d)", full.Name, len(segs), jobs.MaxFoldSegments))
	}
	in := jobs.FoldInputs{Full: jobs.FoldRef{Name: full.Name, SHA256: full.SHA256}, ToRevision: last}
	size := full.PlainSize()
	for _, s := range segs {
		in.Segments = append(in.Segments, jobs.FoldRef{Name: s.Name, SHA256: s.SHA256})
		size += s.PlainSize()
	}
	name := jobs.FoldName(t.Name, last)
	_, err = c.agents.StartFold(ctx, jobs.FoldSpec{
		Target: t, Backup: name, Location: locName, Inputs: in,
		Compression: ebv1.CompressionFromName(t.Compression), AgeRecipients: t.AgeRecipients(), IdentitySecret: t.Deltas.IdentitySecret,
		SnapshotBytes: size,
	})
	if errors.Is(err, jobs.ErrRunning) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("start the fold of chain %q into %q: %w", full.Name, name, err)
	}
	c.log.Info("delta chain fold started", "target", t.Name, "chain", full.Name, "fromRevision", full.Etcd.Revision, "toRevision", last,
		"segments", len(segs), "backup", name)
	return nil
}
