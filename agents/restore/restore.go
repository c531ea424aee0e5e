// Package restore is the restore agent's flow: it rebuilds one etcd
// member's data directory from a backup fetched through the data server
// (package member, the flow `restore --local` runs too) and reports each
// step as a structured log line, which the Job's log keeps for the
// operator and for the server's last words of a failed restore.
package restore

import (
	"context"
	"log/slog"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
)

// Run restores o.Member from backup o.Name through c, logging to log what
// it fetched, checked, moved aside and restored, and the warnings an
// operator must act on (the server's keys removed, no revision bump).
// Errors are member.Restore's.
func Run(ctx context.Context, c *client.Client, o member.Options, log *slog.Logger) (*member.Result, error) {
	// The steps' ends, for the last line's account of where the member's
	// part of the recovery time went.
	began := time.Now()
	var steps []any
	last := began
	endStep := func(name string) {
		now := time.Now()
		steps = append(steps, name, elapsed(now.Sub(last)))
		last = now
	}
	downloaded := false
	if d := o.Deltas; d != nil {
		log.Info("downloading backup and delta segments", "backup", o.Name, "location", o.Location, "segments", len(d.Segments), "point", d.Point.String())
	} else {
		log.Info("downloading backup", "backup", o.Name, "location", o.Location)
	}
	res, err := member.Restore(ctx, c, o, member.Events{
		Downloading: func(done, total int64) {
			if !downloaded && total > 0 && done >= total {
				downloaded = true
				endStep("download")
			}
		},
		Verified: func(v member.Verified) {
			if !downloaded {
				downloaded = true
				endStep("download")
			}
			endStep("verify")
			// No SHA-256 in the log (see the backup command).
			log.Info("backup verified", "backup", o.Name, "revision", v.Status.Revision, "keys", v.Status.TotalKey)
		},
		Rebuilding: func() {
			if o.Deltas != nil {
				endStep("replay")
			}
		},
		MovedAside: func(to string) { log.Info("old data directory moved aside", "to", to) },
	})
	if err != nil {
		return res, err
	}
	if d := o.Deltas; d != nil {
		log.Info("delta segments replayed", "backup", o.Name, "segments", len(d.Segments), "replayedRevisions", res.ReplayedRevisions,
			"toRevision", res.ToRevision, "pointTime", res.PointTime)
	}
	endStep("rebuild")
	log.Info("member data restored", "member", o.Member.Name, "dataDir", res.DataDir,
		"snapshotRevision", res.SnapshotRevision, "revision", res.Revision, "bumpRevision", res.BumpRevision, "markedCompacted", res.MarkedCompacted,
		"took", elapsed(time.Since(began)), slog.Group("steps", steps...))
	if len(res.RevokedServerKeys) > 0 {
		log.Warn("the restored cluster held the data server's Job-signing key and agent CA, as every backup of it does: their Secrets were removed one revision past the restored keyspace, and the server makes new ones within 30 s; agent Jobs of before are refused",
			"member", o.Member.Name, "removed", res.RevokedServerKeys, "revision", res.Revision)
	}
	if res.BumpRevision == 0 {
		log.Warn("revisions kept as in the snapshot (--bump-revision 0), nothing marked compacted: Kubernetes clients of this etcd (kube-apiserver's watch cache, informers, kubelets) may keep stale caches and miss changes; restart them",
			"member", o.Member.Name, "revision", res.Revision)
	}
	return res, nil
}

// elapsed is a step's time as the log says it, to a tenth of a second.
func elapsed(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }
