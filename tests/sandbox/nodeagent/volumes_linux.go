//go:build linux

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// podVolume is a volume set up for the Pod: a host path that containers
// bind-mount.
type podVolume struct {
	path string
	// readOnly: Secret, ConfigMap, downward API and projected volumes are
	// always mounted read-only, as the kubelet does.
	readOnly bool
}

// tokenFile is a projected service-account token the agent keeps fresh.
type tokenFile struct {
	path      string
	sa        string
	audience  string
	expSecs   int64
	mode      fs.FileMode
	owner     *int64
	refreshAt time.Time
}

// fileData is one file of a Secret-like volume.
type fileData struct {
	data []byte
	mode fs.FileMode
}

// setupVolumes prepares every volume of the Pod not prepared yet.
func (w *podWorker) setupVolumes(ctx context.Context, pod *corev1.Pod) error {
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if _, ok := w.volumes[v.Name]; ok {
			continue
		}
		pv, err := w.setupVolume(ctx, pod, v)
		if err != nil {
			return fmt.Errorf("MountVolume.SetUp failed for volume %q : %w", v.Name, err)
		}
		w.volumes[v.Name] = pv
	}
	return nil
}

func (w *podWorker) volumeDir(kind, name string) (string, error) {
	dir := filepath.Join(w.dir, "volumes", "kubernetes.io~"+kind, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

func (w *podWorker) setupVolume(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) (*podVolume, error) {
	fsGroup := fsGroupOf(pod)
	switch {
	case v.EmptyDir != nil:
		dir, err := w.volumeDir("empty-dir", v.Name)
		if err != nil {
			return nil, err
		}
		// The kubelet makes emptyDir world-writable.
		if err := os.Chmod(dir, 0o777); err != nil {
			return nil, err
		}
		return &podVolume{path: dir}, setOwnership(dir, fsGroup, false)

	case v.Secret != nil:
		files, err := w.secretFiles(ctx, pod.Namespace, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode)
		if err != nil {
			return nil, err
		}
		return w.keyedVolume("secret", v.Name, files, fsGroup)

	case v.ConfigMap != nil:
		files, err := w.configMapFiles(ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode)
		if err != nil {
			return nil, err
		}
		return w.keyedVolume("configmap", v.Name, files, fsGroup)

	case v.DownwardAPI != nil:
		files, err := w.downwardFiles(pod, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
		if err != nil {
			return nil, err
		}
		return w.keyedVolume("downward-api", v.Name, files, fsGroup)

	case v.Projected != nil:
		return w.projectedVolume(ctx, pod, v, fsGroup)

	case v.PersistentVolumeClaim != nil:
		return w.claimVolume(ctx, pod.Namespace, v.PersistentVolumeClaim.ClaimName, v.PersistentVolumeClaim.ReadOnly)

	case v.Ephemeral != nil:
		// The ephemeral volume controller names the claim POD-VOLUME.
		return w.claimVolume(ctx, pod.Namespace, pod.Name+"-"+v.Name, false)

	case v.HostPath != nil:
		path, err := w.hostPath(v.HostPath.Path, ptr.Deref(v.HostPath.Type, corev1.HostPathUnset))
		if err != nil {
			return nil, err
		}
		return &podVolume{path: path}, nil
	}
	return nil, errors.New("volume type not supported by the sandbox node agent (emptyDir, secret, configMap, downwardAPI, projected, persistentVolumeClaim, ephemeral and hostPath are)")
}

func defaultMode(m *int32) fs.FileMode {
	if m == nil {
		return 0o644
	}
	return fs.FileMode(*m)
}

func itemMode(m *int32, def fs.FileMode) fs.FileMode {
	if m == nil {
		return def
	}
	return fs.FileMode(*m)
}

// keyedFiles picks files from a Secret's or ConfigMap's data: every key, or
// only the listed items at their paths.
func keyedFiles(kind, name string, data map[string][]byte, items []corev1.KeyToPath, optional bool, mode fs.FileMode) (map[string]fileData, error) {
	files := map[string]fileData{}
	if len(items) == 0 {
		for k, v := range data {
			files[k] = fileData{data: v, mode: mode}
		}
		return files, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("configuration of %s %q has no key %q", kind, name, it.Key)
		}
		files[it.Path] = fileData{data: v, mode: itemMode(it.Mode, mode)}
	}
	return files, nil
}

func (w *podWorker) secretFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool, mode *int32) (map[string]fileData, error) {
	s, err := w.a.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && ptr.Deref(optional, false) {
			return map[string]fileData{}, nil
		}
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	return keyedFiles("secret", name, s.Data, items, ptr.Deref(optional, false), defaultMode(mode))
}

func (w *podWorker) configMapFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool, mode *int32) (map[string]fileData, error) {
	cm, err := w.a.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && ptr.Deref(optional, false) {
			return map[string]fileData{}, nil
		}
		return nil, fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyedFiles("configmap", name, data, items, ptr.Deref(optional, false), defaultMode(mode))
}

func (w *podWorker) downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode *int32) (map[string]fileData, error) {
	info := w.podInfo(pod)
	files := map[string]fileData{}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = info.fieldValue(it.FieldRef)
		case it.ResourceFieldRef != nil:
			c := &corev1.Container{}
			for i := range pod.Spec.Containers {
				if pod.Spec.Containers[i].Name == it.ResourceFieldRef.ContainerName {
					c = &pod.Spec.Containers[i]
				}
			}
			v, err = info.resourceValue(it.ResourceFieldRef, c)
		}
		if err != nil {
			return nil, err
		}
		files[it.Path] = fileData{data: []byte(v), mode: itemMode(it.Mode, defaultMode(mode))}
	}
	return files, nil
}

func (w *podWorker) podInfo(pod *corev1.Pod) *podInfo {
	info := &podInfo{pod: pod, hostIP: w.a.cfg.HostIP, allocatable: w.a.cfg.Allocatable}
	if w.ip.IsValid() {
		info.podIP = w.ip.String()
	}
	return info
}

// keyedVolume writes the files of a Secret-like volume into its directory.
func (w *podWorker) keyedVolume(kind, name string, files map[string]fileData, fsGroup *int64) (*podVolume, error) {
	dir, err := w.volumeDir(kind, name)
	if err != nil {
		return nil, err
	}
	if err := writeFiles(dir, files, nil); err != nil {
		return nil, err
	}
	return &podVolume{path: dir, readOnly: true}, setOwnership(dir, fsGroup, true)
}

// writeFiles writes files (relative paths) under dir, each atomically
// (temp file, then rename), owned by owner when set.
func writeFiles(dir string, files map[string]fileData, owner *int64) error {
	for rel, f := range files {
		clean := filepath.Clean(rel)
		if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("invalid file path %q", rel)
		}
		path := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := writeFileAtomic(path, f.data, f.mode, owner); err != nil {
			return err
		}
	}
	return nil
}

func writeFileAtomic(path string, data []byte, mode fs.FileMode, owner *int64) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), mode.Perm()); err != nil {
		return err
	}
	if owner != nil {
		if err := os.Lchown(tmp.Name(), int(*owner), -1); err != nil {
			return err
		}
	}
	return os.Rename(tmp.Name(), path)
}

// projectedVolume combines Secret, ConfigMap, downward API and
// service-account token sources into one directory.
func (w *podWorker) projectedVolume(ctx context.Context, pod *corev1.Pod, v *corev1.Volume, fsGroup *int64) (*podVolume, error) {
	dir, err := w.volumeDir("projected", v.Name)
	if err != nil {
		return nil, err
	}
	mode := defaultMode(v.Projected.DefaultMode)
	// As the kubelet: with no fsGroup, token files belong to the user all
	// containers run as, so a non-root container can read a 0600 token.
	var owner *int64
	if fsGroup == nil {
		owner = commonRunAsUser(pod)
	}
	files := map[string]fileData{}
	for _, src := range v.Projected.Sources {
		var part map[string]fileData
		var err error
		switch {
		case src.Secret != nil:
			part, err = w.secretFiles(ctx, pod.Namespace, src.Secret.Name, src.Secret.Items, src.Secret.Optional, v.Projected.DefaultMode)
		case src.ConfigMap != nil:
			part, err = w.configMapFiles(ctx, pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, v.Projected.DefaultMode)
		case src.DownwardAPI != nil:
			part, err = w.downwardFiles(pod, src.DownwardAPI.Items, v.Projected.DefaultMode)
		case src.ServiceAccountToken != nil:
			tok := &tokenFile{
				path:     filepath.Join(dir, filepath.Clean(src.ServiceAccountToken.Path)),
				sa:       pod.Spec.ServiceAccountName,
				audience: src.ServiceAccountToken.Audience,
				expSecs:  ptr.Deref(src.ServiceAccountToken.ExpirationSeconds, 3600),
				mode:     mode,
				owner:    owner,
			}
			if tok.sa == "" {
				tok.sa = "default"
			}
			if err := w.writeToken(ctx, pod, tok); err != nil {
				return nil, err
			}
			w.tokens = append(w.tokens, tok)
		default:
			err = errors.New("projected volume source not supported by the sandbox node agent")
		}
		if err != nil {
			return nil, err
		}
		for k, f := range part {
			files[k] = f
		}
	}
	if err := writeFiles(dir, files, nil); err != nil {
		return nil, err
	}
	return &podVolume{path: dir, readOnly: true}, setOwnership(dir, fsGroup, true)
}

// writeToken requests a token bound to the Pod (TokenRequest, as the
// kubelet's token manager) and writes it; it is refreshed at 80% of its
// lifetime.
func (w *podWorker) writeToken(ctx context.Context, pod *corev1.Pod, tok *tokenFile) error {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(tok.expSecs),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}
	if tok.audience != "" {
		req.Spec.Audiences = []string{tok.audience}
	}
	tr, err := w.a.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, tok.sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("request token for service account %s/%s: %w", pod.Namespace, tok.sa, err)
	}
	if err := os.MkdirAll(filepath.Dir(tok.path), 0o755); err != nil {
		return err
	}
	if err := writeFileAtomic(tok.path, []byte(tr.Status.Token), tok.mode, tok.owner); err != nil {
		return fmt.Errorf("write token: %w", err)
	}
	now := time.Now()
	life := tr.Status.ExpirationTimestamp.Sub(now)
	tok.refreshAt = now.Add(life * 8 / 10)
	return nil
}

// refreshTokens renews the tokens that are due and returns when the next
// one is.
func (w *podWorker) refreshTokens(ctx context.Context, pod *corev1.Pod) (time.Time, error) {
	var next time.Time
	for _, tok := range w.tokens {
		if time.Now().After(tok.refreshAt) {
			if err := w.writeToken(ctx, pod, tok); err != nil {
				return time.Time{}, err
			}
		}
		if next.IsZero() || tok.refreshAt.Before(next) {
			next = tok.refreshAt
		}
	}
	return next, nil
}

// claimVolume resolves a PersistentVolumeClaim to its bound volume's
// directory under the node's root (hostPath and local PVs are supported).
func (w *podWorker) claimVolume(ctx context.Context, ns, claim string, readOnly bool) (*podVolume, error) {
	pvc, err := w.a.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("persistentvolumeclaim %q: %w", claim, err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return nil, fmt.Errorf("persistentvolumeclaim %q is not bound", claim)
	}
	pv, err := w.a.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("persistentvolume %q: %w", pvc.Spec.VolumeName, err)
	}
	var path string
	typ := corev1.HostPathDirectoryOrCreate
	switch {
	case pv.Spec.HostPath != nil:
		path = pv.Spec.HostPath.Path
		if pv.Spec.HostPath.Type != nil && *pv.Spec.HostPath.Type != corev1.HostPathUnset {
			typ = *pv.Spec.HostPath.Type
		}
	case pv.Spec.Local != nil:
		path, typ = pv.Spec.Local.Path, corev1.HostPathDirectory
	default:
		return nil, fmt.Errorf("persistentvolume %q: only hostPath and local volumes exist on the sandbox node", pv.Name)
	}
	dir, err := w.hostPath(path, typ)
	if err != nil {
		return nil, fmt.Errorf("persistentvolume %q: %w", pv.Name, err)
	}
	return &podVolume{path: dir, readOnly: readOnly}, nil
}

// NodePath maps a path of the node's host filesystem into NodeRoot.
func (a *Agent) NodePath(path string) string {
	return filepath.Join(a.cfg.NodeRoot, filepath.Clean("/"+path))
}

// hostPath resolves a hostPath volume under the node's root, applying its
// type's checks and creations.
func (w *podWorker) hostPath(path string, typ corev1.HostPathType) (string, error) {
	p := w.a.NodePath(path)
	fi, err := os.Stat(p)
	exists := err == nil
	switch typ {
	case corev1.HostPathUnset, corev1.HostPathDirectoryOrCreate:
		if !exists {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return "", err
			}
		}
	case corev1.HostPathFileOrCreate:
		if !exists {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return "", err
			}
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return "", err
			}
		}
	case corev1.HostPathDirectory:
		if !exists || !fi.IsDir() {
			return "", fmt.Errorf("hostPath type check failed: %s is not a directory", path)
		}
	case corev1.HostPathFile:
		if !exists || !fi.Mode().IsRegular() {
			return "", fmt.Errorf("hostPath type check failed: %s is not a file", path)
		}
	default:
		if !exists {
			return "", fmt.Errorf("hostPath type check failed: %s does not exist", path)
		}
	}
	return p, nil
}

func fsGroupOf(pod *corev1.Pod) *int64 {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	return pod.Spec.SecurityContext.FSGroup
}

// commonRunAsUser is the user every container runs as, if they agree.
func commonRunAsUser(pod *corev1.Pod) *int64 {
	var uid *int64
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		u, _, _ := runAs(pod, &c)
		if uid != nil && *uid != u {
			return nil
		}
		uid = ptr.To(u)
	}
	return uid
}

// setOwnership gives a volume to the Pod's fsGroup like the kubelet's
// SetVolumeOwnership: group fsGroup, group-readable (and writable unless
// readOnly), directories setgid so new files inherit the group.
func setOwnership(dir string, fsGroup *int64, readOnly bool) error {
	if fsGroup == nil {
		return nil
	}
	mask := fs.FileMode(0o660)
	if readOnly {
		mask = 0o440
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		if err := os.Lchown(path, -1, int(*fsGroup)); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky) | mask
		if d.IsDir() {
			mode |= fs.ModeSetgid | 0o110
		}
		return os.Chmod(path, mode)
	})
}
