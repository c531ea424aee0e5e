package jobs

import batchv1 "k8s.io/api/batch/v1"

// BackupJobFor is the Job StartBackup creates for spec.
func (l *Launcher) BackupJobFor(spec BackupSpec) *batchv1.Job { return l.backupJob(spec) }

// CachedEvents is how many events the Launcher holds for namespace ns.
func (l *Launcher) CachedEvents(ns string) int {
	return len(l.caches.Load().byNS[ns].events.GetStore().List())
}
