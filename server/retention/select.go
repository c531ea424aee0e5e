// Package retention decides which backups a target's retention removes
// (keepLast, maxAge, never the newest, scheduled ones only unless asked)
// and removes them, keeping those in use: downloads in progress and
// backups a running restore Job reads.
package retention

import (
	"slices"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Labels the server puts on scheduled backups, for `list -l`. They say
// what the manifest's source says (storage.Source.Scheduled, Target);
// nothing is decided by them, and clients may not set any label under
// etcdbackup.io/ (ReservedLabelPrefix).
const (
	LabelScheduled = "etcdbackup.io/scheduled"
	LabelTarget    = "etcdbackup.io/target"
	// ReservedLabelPrefix is the prefix of the labels only the server
	// writes.
	ReservedLabelPrefix = ebv1.ReservedLabelPrefix
)

// ScheduledOf tells whether m is a scheduled backup, and of which target.
// The server's word is the manifest's source (Scheduled, written when a
// scheduled agent's upload commits). Backups stored by servers before it
// had that field say so in their labels, which then came from the agent
// Job; those are believed only for an agent's backup of that very
// target.
func ScheduledOf(m *storage.Manifest) (target string, ok bool) {
	switch {
	case m.Source.Kind != ebv1.SourceAgent || m.Source.Target == "":
		return "", false
	case m.Source.Scheduled:
		return m.Source.Target, true
	case m.Source.ScheduledTime.IsZero() && m.Labels[LabelScheduled] == "true" && m.Labels[LabelTarget] == m.Source.Target:
		return m.Source.Target, true // written before Source.Scheduled
	}
	return "", false
}

// ofTarget tells whether m is a backup of target: one of its scheduled
// backups or, when unscheduled ones count too, any an agent took of it.
func ofTarget(m *storage.Manifest, target string, includeUnscheduled bool) bool {
	if includeUnscheduled {
		return m.Source.Kind == ebv1.SourceAgent && m.Source.Target == target
	}
	t, ok := ScheduledOf(m)
	return ok && t == target
}

// Select returns what retention r removes of target's backups among
// manifests (one location), newest first: those beyond the newest
// KeepLast, and those older than MaxAge — never the newest, nor the
// newest one a restore drill verified (the one known to restore).
func Select(manifests []*storage.Manifest, target string, r config.Retention, includeUnscheduled bool, now time.Time) []*storage.Manifest {
	var mine []*storage.Manifest
	for _, m := range manifests {
		if ofTarget(m, target, includeUnscheduled) {
			mine = append(mine, m)
		}
	}
	// Newest first, as backups are listed.
	slices.SortFunc(mine, func(a, b *storage.Manifest) int {
		return ebv1.CompareListing(a.CreateTime, a.Name, b.CreateTime, b.Name)
	})
	verified := slices.IndexFunc(mine, Verified)
	var out []*storage.Manifest
	for i, m := range mine {
		if i == 0 || i == verified {
			continue // the newest is the one to restore from; the newest verified one is known to restore
		}
		if (r.KeepLast > 0 && i >= r.KeepLast) || (r.MaxAge.Duration > 0 && now.Sub(m.CreateTime) > r.MaxAge.Duration) {
			out = append(out, m)
		}
	}
	return out
}

// Verified says whether m's newest restore drill succeeded.
func Verified(m *storage.Manifest) bool {
	return m.Verification != nil && m.Verification.Result == storage.VerificationSucceeded
}
