package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The sandbox keeps what a kubeadm control-plane node keeps in
// /etc/kubernetes under KubernetesDir: pki/ (etcd's certificates in
// pki/, the service-account keys), enc/ (the API server's encryption
// configuration) and manifests/, the static pods of etcd and
// kube-apiserver as kubeadm writes them, with the sandbox's own flags
// and its directories as hostPath volumes. The node sees these paths as
// the host does, so an agent pod reads them through a hostPath volume as
// it would on a kubeadm node. The sandbox starts its control plane
// itself; StartControlPlaneFromManifests starts it from the manifests as
// a kubelet would: etcd on the data directory its manifest mounts,
// kube-apiserver only if every file its manifest names is there.

// KubernetesDir is the sandbox's /etc/kubernetes.
func (s *Sandbox) KubernetesDir() string { return filepath.Join(s.dir, "kubernetes") }

// ManifestsDir is its static-pod directory.
func (s *Sandbox) ManifestsDir() string { return filepath.Join(s.KubernetesDir(), "manifests") }

// etcdDataMount is where the etcd static pod sees its data directory.
const etcdDataMount = "/var/lib/etcd"

// writeStaticPods writes the manifests of the running etcd and
// kube-apiserver.
func (s *Sandbox) writeStaticPods() error {
	pki := s.pki.dir
	etcd := staticPod("etcd", "registry.k8s.io/etcd:3.7", []string{"etcd",
		"--name=" + etcdMemberName,
		"--data-dir=" + etcdDataMount,
		"--initial-advertise-peer-urls=" + s.etcd.peerURL.String(),
		"--initial-cluster=" + etcdMemberName + "=" + s.etcd.peerURL.String(),
		"--initial-cluster-token=" + etcdClusterToken,
		"--listen-client-urls=" + s.etcd.clientURL.String() + "," + s.etcd.hostClientURL.String(),
		"--advertise-client-urls=" + s.etcd.clientURL.String(),
		"--listen-peer-urls=" + s.etcd.peerURL.String(),
		"--client-cert-auth=true",
		"--cert-file=" + s.pki.etcdServer.certFile,
		"--key-file=" + s.pki.etcdServer.keyFile,
		"--trusted-ca-file=" + s.pki.etcdCA.certFile,
	}, map[string]string{"etcd-data": filepath.Join(s.dir, "etcd"), "etcd-certs": pki}, map[string]string{"etcd-data": etcdDataMount, "etcd-certs": pki})
	apiserver := staticPod("kube-apiserver", "registry.k8s.io/kube-apiserver:v1.37.2",
		append([]string{"kube-apiserver"}, apiserverArgs(s.dir, s.pki, s.etcd.clientURL.String(), s.apiserver.port)...),
		map[string]string{"k8s-certs": pki, "encryption": filepath.Dir(s.pki.encryptionConfigFile)},
		map[string]string{"k8s-certs": pki, "encryption": filepath.Dir(s.pki.encryptionConfigFile)})
	if err := os.MkdirAll(s.ManifestsDir(), 0o700); err != nil {
		return err
	}
	for name, pod := range map[string]*corev1.Pod{"etcd.yaml": etcd, "kube-apiserver.yaml": apiserver} {
		b, err := yaml.Marshal(pod)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(s.ManifestsDir(), name), b, 0o600); err != nil {
			return fmt.Errorf("write static pod %s: %w", name, err)
		}
	}
	return nil
}

func staticPod(name, image string, command []string, hostPaths, mountPaths map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"component": name, "tier": "control-plane"}},
		Spec:       corev1.PodSpec{HostNetwork: true, PriorityClassName: "system-node-critical"},
	}
	c := corev1.Container{Name: name, Image: image, Command: command}
	for _, v := range slices.Sorted(maps.Keys(hostPaths)) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostPaths[v]}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v, MountPath: mountPaths[v]})
	}
	p.Spec.Containers = []corev1.Container{c}
	return p
}

// StartControlPlaneFromManifests starts the control plane as the node's
// kubelet would from ManifestsDir: etcd on the host directory its
// manifest mounts at its --data-dir, then kube-apiserver and the
// controllers, refusing, as a crash-looping static pod would, when a
// manifest is missing or a file it names is not there.
func (s *Sandbox) StartControlPlaneFromManifests(ctx context.Context) error {
	read := func(name string) (*corev1.Pod, error) {
		b, err := os.ReadFile(filepath.Join(s.ManifestsDir(), name))
		if err != nil {
			return nil, fmt.Errorf("sandbox: static pod %s: %w", name, err)
		}
		var p corev1.Pod
		if err := yaml.UnmarshalStrict(b, &p); err != nil || len(p.Spec.Containers) != 1 {
			return nil, fmt.Errorf("sandbox: static pod %s is not a one-container Pod: %v", name, err)
		}
		return &p, nil
	}
	etcd, err := read("etcd.yaml")
	if err != nil {
		return err
	}
	apiserver, err := read("kube-apiserver.yaml")
	if err != nil {
		return err
	}
	dataDir := ""
	for _, v := range etcd.Spec.Volumes {
		for _, m := range etcd.Spec.Containers[0].VolumeMounts {
			if m.Name == v.Name && m.MountPath == etcdDataMount && v.HostPath != nil {
				dataDir = v.HostPath.Path
			}
		}
	}
	if dataDir == "" {
		return errors.New("sandbox: static pod etcd.yaml mounts no host directory at " + etcdDataMount)
	}
	for _, pod := range []*corev1.Pod{etcd, apiserver} {
		for _, a := range pod.Spec.Containers[0].Command {
			k, v, ok := strings.Cut(a, "=")
			if ok && (strings.HasSuffix(k, "-file") || strings.HasSuffix(k, "-config")) && filepath.IsAbs(v) {
				if _, err := os.Stat(v); err != nil {
					return fmt.Errorf("sandbox: static pod %s: %s: %w", pod.Name, k, err)
				}
			}
		}
	}
	return s.StartControlPlane(ctx, dataDir)
}
