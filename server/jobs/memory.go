package jobs

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// sizeMemoryFor raises the memory limit of job's agent, when it is the
// server's default (agents.resources not configured), to the default plus
// snapshotBytes: a restore, a drill or a fold runs etcd's own restore
// code, which maps the whole database and writes a copy of it, and the
// file pages it touches are charged to the agent's memory cgroup. Under a
// limit below the database's size the kernel reclaims and re-reads them
// without end: `restore --target --wait` of a three-member target from a
// 1 GiB backup took 3 min 3 s under 512Mi against 37 s under 3Gi
// (BenchmarkRestoreCluster). The request stays the default's, so
// scheduling is unchanged; the pages are reclaimable cache, not memory
// the agent keeps. Configured resources are the operator's and are left
// as they are (manifests/server.yaml and docs/disaster-recovery.md say
// what these agents need).
func (l *Launcher) sizeMemoryFor(job *batchv1.Job, snapshotBytes int64) {
	def := config.DefaultAgentResources()
	if snapshotBytes <= 0 || l.agents.Resources == nil || !equality.Semantic.DeepEqual(*l.agents.Resources, def) {
		return
	}
	limit := def.Limits[corev1.ResourceMemory]
	// In whole MiB, as an operator would write it.
	mib := (limit.Value() + snapshotBytes + 1<<20 - 1) >> 20
	c := &job.Spec.Template.Spec.Containers[0]
	c.Resources.Limits[corev1.ResourceMemory] = *resource.NewQuantity(mib<<20, resource.BinarySI)
}
