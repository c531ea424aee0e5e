package jobs_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/agenttls"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// Every agent verifies the server's agent port with the CA the server
// publishes: the ConfigMap mounted read-only, --server-ca pointing into it.
func TestAgentJobsMountTheServerCA(t *testing.T) {
	l, _ := newLauncher(t, config.Agents{})
	job, err := l.StartBackup(context.Background(), jobs.BackupSpec{
		Name: "b", Location: "default",
		Target: config.Target{Name: "plain", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "server-ca" })
	if i < 0 || pod.Volumes[i].ConfigMap == nil || pod.Volumes[i].ConfigMap.Name != agenttls.ConfigMapName {
		t.Fatalf("volumes %+v: no ConfigMap %s", pod.Volumes, agenttls.ConfigMapName)
	}
	c := pod.Containers[0]
	if !slices.Contains(c.Args, "--server-ca="+jobs.ServerCAPath) {
		t.Errorf("args %q lack --server-ca", c.Args)
	}
	m := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "server-ca" })
	if m < 0 || !c.VolumeMounts[m].ReadOnly || c.VolumeMounts[m].MountPath != jobs.ServerCADir {
		t.Errorf("mounts %+v", c.VolumeMounts)
	}
}
