package jobs_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// restoreTarget has one member on a claim: its restore Job unpacks the
// snapshot into an emptyDir.
var restoreTarget = config.Target{
	Name: "app", Endpoints: []string{"http://app-etcd:2379"}, Namespace: "app", InitialClusterToken: "tok",
	Members: []config.Member{{Name: "m0", PeerURL: "http://m0:2380", Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m0"}}}},
}

// agentPods starts an agent of each kind (backup, restore, drill, fold,
// delta) and returns their pod specs.
func agentPods(t *testing.T, agents config.Agents) map[string]corev1.PodSpec {
	t.Helper()
	l, cs := newLauncher(t, agents)
	ctx := context.Background()
	b, err := l.StartBackup(ctx, jobs.BackupSpec{Name: "b", Location: "default", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b", Location: "default", Target: restoreTarget,
		SHA256: "6794a8ff9654e821ba067dda207cf98ec8f022ce1c001fd07cd542530cd173f5"})
	if err != nil {
		t.Fatal(err)
	}
	putSecret(t, cs, "age-key", map[string]string{"identity.txt": fakeAgeIdentity})
	d, err := l.StartDrill(ctx, jobs.DrillSpec{Backup: "b", Location: "default", Target: target.Name,
		SHA256: "6794a8ff9654e821ba067dda207cf98ec8f022ce1c001fd07cd542530cd173f5", IdentitySecret: "age-key"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.StartFold(ctx, jobs.FoldSpec{Target: target, Backup: jobs.FoldName(target.Name, 5000), Location: "default",
		Inputs: foldInputs(3), IdentitySecret: "age-key"})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := l.StartDelta(ctx, jobs.DeltaSpec{Target: target, Chain: "c", Location: "default", FromRevision: 1, Period: time.Minute, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]corev1.PodSpec{"backup": b.Spec.Template.Spec, "restore": r[0].Spec.Template.Spec,
		"drill": d.Spec.Template.Spec, "fold": f.Spec.Template.Spec, "delta": dl.Spec.Template.Spec}
}

// scratchKinds are the agents that unpack or restore a backup into an
// emptyDir scratch volume: each must have one, with the bound.
var scratchKinds = map[string]bool{"restore": true, "drill": true, "fold": true}

func quantity(l corev1.ResourceList, n corev1.ResourceName) string {
	q, ok := l[n]
	if !ok {
		return "<none>"
	}
	return q.String()
}

func TestAgentResourcesDefault(t *testing.T) {
	for kind, pod := range agentPods(t, config.Agents{}) {
		r := pod.Containers[0].Resources
		if got := [3]string{quantity(r.Requests, corev1.ResourceCPU), quantity(r.Requests, corev1.ResourceMemory), quantity(r.Limits, corev1.ResourceMemory)}; got != [3]string{"100m", "128Mi", "512Mi"} {
			t.Errorf("%s agent: requests cpu, memory and limits memory %v; want 100m, 128Mi, 512Mi", kind, got)
		}
		scratch := 0
		for _, v := range pod.Volumes {
			if v.EmptyDir == nil {
				continue
			}
			scratch++
			if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != "20Gi" {
				t.Errorf("%s agent: emptyDir %q has sizeLimit %v; want 20Gi", kind, v.Name, v.EmptyDir.SizeLimit)
			}
		}
		if scratchKinds[kind] && scratch == 0 {
			t.Errorf("%s agent has no emptyDir scratch volume to check: %+v", kind, pod.Volumes)
		}
	}
}

func TestAgentResourcesConfigured(t *testing.T) {
	size := resource.MustParse("3Gi")
	pods := agentPods(t, config.Agents{
		Resources: &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi"), corev1.ResourceCPU: resource.MustParse("2")},
		},
		ScratchSizeLimit: &size,
	})
	for kind, pod := range pods {
		r := pod.Containers[0].Resources
		if got := [3]string{quantity(r.Requests, corev1.ResourceMemory), quantity(r.Limits, corev1.ResourceMemory), quantity(r.Limits, corev1.ResourceCPU)}; got != [3]string{"1Gi", "2Gi", "2"} {
			t.Errorf("%s agent: requests memory, limits memory and cpu %v; want 1Gi, 2Gi, 2", kind, got)
		}
		if _, ok := r.Requests[corev1.ResourceCPU]; ok {
			t.Errorf("%s agent: the configured resources got the default cpu request too: %v", kind, r.Requests)
		}
		scratch := 0
		for _, v := range pod.Volumes {
			if v.EmptyDir == nil {
				continue
			}
			scratch++
			if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.String() != "3Gi" {
				t.Errorf("%s agent: emptyDir %q sizeLimit %v; want 3Gi", kind, v.Name, v.EmptyDir.SizeLimit)
			}
		}
		if scratchKinds[kind] && scratch == 0 {
			t.Errorf("%s agent has no emptyDir scratch volume to check: %+v", kind, pod.Volumes)
		}
	}
	// `resources: {}` asks for none.
	for kind, pod := range agentPods(t, config.Agents{Resources: &corev1.ResourceRequirements{}}) {
		if r := pod.Containers[0].Resources; len(r.Requests)+len(r.Limits) != 0 {
			t.Errorf("%s agent with resources {}: %+v; want none", kind, r)
		}
	}
}

// Restore, drill and fold agents run etcd's restore code, which maps the
// whole database: under the default resources their memory limit grows by the
// snapshot's size (in whole MiB), the request stays; configured
// resources are kept as they are.
func TestRestoreDrillAndFoldMemorySizedToSnapshot(t *testing.T) {
	const sha = "6794a8ff9654e821ba067dda207cf98ec8f022ce1c001fd07cd542530cd173f5"
	limits := func(t *testing.T, agents config.Agents, snapshot int64) (restore, drill, fold corev1.ResourceRequirements) {
		t.Helper()
		l, _ := newLauncher(t, agents)
		ctx := context.Background()
		r, err := l.StartRestore(ctx, jobs.RestoreSpec{Name: "b", Location: "default", Target: restoreTarget, SHA256: sha, SnapshotBytes: snapshot})
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.StartDrill(ctx, jobs.DrillSpec{Backup: "b", Location: "default", Target: target.Name, SHA256: sha, SnapshotBytes: snapshot})
		if err != nil {
			t.Fatal(err)
		}
		f, err := l.StartFold(ctx, jobs.FoldSpec{Target: target, Backup: jobs.FoldName(target.Name, 5000), Location: "default",
			Inputs: foldInputs(3), SnapshotBytes: snapshot})
		if err != nil {
			t.Fatal(err)
		}
		return r[0].Spec.Template.Spec.Containers[0].Resources, d.Spec.Template.Spec.Containers[0].Resources, f.Spec.Template.Spec.Containers[0].Resources
	}
	for _, c := range []struct {
		name     string
		agents   config.Agents
		snapshot int64
		limit    string
	}{
		{"1 GiB under the default", config.Agents{}, 1 << 30, "1536Mi"},
		{"a part of a MiB rounds up", config.Agents{}, 100<<20 + 1, "613Mi"},
		{"size unknown", config.Agents{}, 0, "512Mi"},
		{"configured", config.Agents{Resources: &corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("768Mi")}}}, 1 << 30, "768Mi"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, d, f := limits(t, c.agents, c.snapshot)
			for kind, res := range map[string]corev1.ResourceRequirements{"restore": r, "drill": d, "fold": f} {
				if got := quantity(res.Limits, corev1.ResourceMemory); got != c.limit {
					t.Errorf("%s agent's memory limit %s, want %s", kind, got, c.limit)
				}
				if c.agents.Resources == nil {
					if got := quantity(res.Requests, corev1.ResourceMemory); got != "128Mi" {
						t.Errorf("%s agent's memory request %s, want the default's 128Mi", kind, got)
					}
				}
			}
		})
	}
	// The backup agent streams: its limit is the default's whatever the
	// size of what it backs up.
	if got := quantity(agentPods(t, config.Agents{})["backup"].Containers[0].Resources.Limits, corev1.ResourceMemory); got != "512Mi" {
		t.Errorf("backup agent's memory limit %s, want 512Mi", got)
	}
}
