package jobs

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/agenttls"
)

// Agents verify the server's agent port with the server's CA certificate,
// which the server publishes in ConfigMap agenttls.ConfigMapName of every
// namespace agents run in (public: no secret in it).
const (
	// ServerCADir is where that ConfigMap is mounted in the agent.
	ServerCADir = "/etc/etcdbackup/server-ca"
	// ServerCAPath is the agent's --server-ca.
	ServerCAPath = ServerCADir + "/" + agenttls.CertKey
)

// withServerCA adds the CA ConfigMap's volume, mounted where the
// agent's --server-ca (Launcher.conn) reads it.
func withServerCA(volumes []corev1.Volume, mounts []corev1.VolumeMount) ([]corev1.Volume, []corev1.VolumeMount) {
	volumes = append(volumes, corev1.Volume{Name: "server-ca", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: agenttls.ConfigMapName},
			Items:                []corev1.KeyToPath{{Key: agenttls.CertKey, Path: agenttls.CertKey}},
			DefaultMode:          ptr.To[int32](0o444),
		},
	}})
	mounts = append(mounts, corev1.VolumeMount{Name: "server-ca", MountPath: ServerCADir, ReadOnly: true})
	return volumes, mounts
}

// SetServerCAPublisher makes StartRestore call publish for the restore
// namespace before it creates a Job there, so the agent's CA ConfigMap
// exists when its pod starts (a namespace created after the server
// started has none yet).
func (l *Launcher) SetServerCAPublisher(publish func(ctx context.Context, namespace string) error) {
	l.publishCA = publish
}

func (l *Launcher) ensureServerCA(ctx context.Context, namespace string) error {
	if l.publishCA == nil {
		return nil
	}
	if err := l.publishCA(ctx, namespace); err != nil {
		return fmt.Errorf("restore agents in namespace %s could not verify the server: %w", namespace, err)
	}
	return nil
}
