package jobs

import (
	"context"
	"strconv"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
)

// kitHostRoot is where a kit agent sees the host's directories: each
// configured path P is mounted read-only at kitHostRoot+P.
const kitHostRoot = "/host"

// KitSpec is the recovery kit of backup Backup of Target, stored in
// Location beside it.
type KitSpec struct {
	Target           config.Target
	Backup, Location string
}

func kitJobName(location, backup string) string {
	return agentjob.Kit.JobName(backup, runID("kit", location, backup))
}

// StartKit creates the kit agent Job of spec: on the node the target's
// kit names, it reads the kit's directories, waits for the backup to be
// stored and stores the kit beside it, sealed to the kit's recipients.
func (l *Launcher) StartKit(ctx context.Context, spec KitSpec) (*batchv1.Job, error) {
	return l.start(ctx, l.kitJob(spec, l.kubeVersion(ctx)))
}

func (l *Launcher) kitJob(spec KitSpec, kubeVersion string) *batchv1.Job {
	t, k := spec.Target, spec.Target.Kit
	flags := agentjob.KitFlags{
		Conn: l.conn(), Name: spec.Backup, Location: spec.Location, Target: t.Name,
		Paths: k.KitPaths(), HostRoot: kitHostRoot, EncryptTo: k.AgeRecipients, Node: k.NodeName, KubeVersion: kubeVersion,
	}
	var volumes []corev1.Volume
	var mounts []corev1.VolumeMount
	for i, p := range flags.Paths {
		name := "host-" + strconv.Itoa(i)
		// Type Directory: a path that is not there fails the pod, where
		// no type would have the runtime create it on the node.
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: p, Type: ptr.To(corev1.HostPathDirectory)},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: kitHostRoot + p, ReadOnly: true})
	}
	job := l.agentJob(jobMeta{
		name: kitJobName(spec.Location, spec.Backup), namespace: l.namespaceOf(agentjob.Kit, t), run: runID("kit", spec.Location, spec.Backup),
		annotations: map[string]string{AnnotationBackup: spec.Backup, AnnotationLocation: spec.Location, AnnotationTarget: t.Name},
	}, hostReaderSecurityContext(), flags, volumes, mounts)
	job.Spec.Template.Spec.NodeName = k.NodeName
	return job
}

// hostReaderSecurityContext is a ReadsHost agent's: root, for a
// kubeadm node keeps its keys readable by root alone, with no
// capability but reading (agentJob adds CAP_DAC_READ_SEARCH), on a
// read-only root filesystem and read-only mounts.
func hostReaderSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(false),
		RunAsUser:      ptr.To[int64](0),
		RunAsGroup:     ptr.To[int64](0),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// kubeVersions remembers the API server's version for a minute: every
// kit Job records it, and it changes only with an upgrade.
type kubeVersions struct {
	mu      sync.Mutex
	version string
	at      time.Time
}

// kubeVersion is the API server's /version gitVersion, "" when it does
// not answer (the kit then records none, and a rebuild says so).
func (l *Launcher) kubeVersion(ctx context.Context) string {
	v := &l.kubeVersions
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.version != "" && time.Since(v.at) < time.Minute {
		return v.version
	}
	info, err := l.client.Discovery().ServerVersion()
	if err != nil {
		return v.version
	}
	v.version, v.at = info.GitVersion, time.Now()
	return v.version
}
