//go:build linux

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// runAs is the user, group and supplementary groups a container runs as:
// the securityContext's (container over Pod), else the image's user.
func runAs(pod *corev1.Pod, c *corev1.Container) (uid, gid int64, groups []int) {
	psc, csc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	uid, uidSet := imageUser, false
	if psc.RunAsUser != nil {
		uid, uidSet = *psc.RunAsUser, true
	}
	if csc.RunAsUser != nil {
		uid, uidSet = *csc.RunAsUser, true
	}
	switch {
	case csc.RunAsGroup != nil:
		gid = *csc.RunAsGroup
	case psc.RunAsGroup != nil:
		gid = *psc.RunAsGroup
	case !uidSet || uid == imageUser:
		// The image's user has the image's group (USER 65532:65532).
		gid = imageUser
	default:
		// A numeric user the image does not know: group 0, as containerd.
		gid = 0
	}
	if psc.FSGroup != nil {
		groups = append(groups, int(*psc.FSGroup))
	}
	for _, g := range psc.SupplementalGroups {
		groups = append(groups, int(g))
	}
	return uid, gid, groups
}

// containerSpec turns a container into the shim's instructions.
func (w *podWorker) containerSpec(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (*shimSpec, error) {
	bin, ok := w.a.imageBinary(c.Image)
	if !ok {
		return nil, configErrorf("image %q is not in the node's image table", c.Image)
	}
	env, err := w.buildEnv(ctx, w.podInfo(pod), c)
	if err != nil {
		return nil, err
	}
	uid, gid, groups := runAs(pod, c)
	nonRoot := ptr.Deref(c.SecurityContext, corev1.SecurityContext{}).RunAsNonRoot
	if nonRoot == nil && pod.Spec.SecurityContext != nil {
		nonRoot = pod.Spec.SecurityContext.RunAsNonRoot
	}
	if ptr.Deref(nonRoot, false) && uid == 0 {
		return nil, configErrorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", pod.Name+"_"+pod.Namespace+"("+string(pod.UID)+")", c.Name)
	}
	// What the image and the runtime add when the Pod does not say.
	defaults := map[string]string{"PATH": imagePath, "HOSTNAME": podHostname(pod), "HOME": "/"}
	for k, v := range defaults {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	var envList []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envList = append(envList, k+"="+env[k])
	}
	lookup := lookupIn(env)
	entrypoint := "/" + ImageName(c.Image)
	var argv []string
	if len(c.Command) > 0 {
		for _, a := range c.Command {
			argv = append(argv, expand(a, lookup))
		}
	} else {
		argv = []string{entrypoint}
	}
	for _, a := range c.Args {
		argv = append(argv, expand(a, lookup))
	}

	// The binary is the image: it sits where the Dockerfile puts it.
	mounts := []shimMount{{Source: bin, Target: entrypoint, ReadOnly: true}}
	targets := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		m, err := w.volumeMount(vm, lookup)
		if err != nil {
			return nil, err
		}
		mounts = append(mounts, m)
		targets[filepath.Clean(vm.MountPath)] = true
	}
	for path, src := range map[string]string{"/etc/hosts": w.hostsPath, "/etc/resolv.conf": w.resolvPath, "/etc/hostname": w.hostnamePath} {
		if !targets[path] {
			mounts = append(mounts, shimMount{Source: src, Target: path, ReadOnly: true})
		}
	}
	sc := ptr.Deref(c.SecurityContext, corev1.SecurityContext{})
	return &shimSpec{
		Root:         w.a.rootfsDir,
		Hostname:     podHostname(pod),
		Mounts:       mounts,
		Argv:         argv,
		Env:          envList,
		WorkDir:      c.WorkingDir,
		UID:          int(uid),
		GID:          int(gid),
		Groups:       groups,
		NoNewPrivs:   sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		ReadOnlyRoot: ptr.Deref(sc.ReadOnlyRootFilesystem, false),
		ParentPID:    os.Getpid(),
	}, nil
}

// volumeMount resolves one volumeMount, subPath included (created if
// missing, and kept inside its volume).
func (w *podWorker) volumeMount(vm corev1.VolumeMount, lookup func(string) (string, bool)) (shimMount, error) {
	vol, ok := w.volumes[vm.Name]
	if !ok {
		return shimMount{}, configErrorf("volumeMount %q names no volume of the pod", vm.Name)
	}
	src := vol.path
	sub := vm.SubPath
	if vm.SubPathExpr != "" {
		sub = expand(vm.SubPathExpr, lookup)
	}
	if sub != "" {
		clean := filepath.Clean(sub)
		if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return shimMount{}, configErrorf("subPath %q must be a relative path inside the volume", sub)
		}
		src = filepath.Join(vol.path, clean)
		if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
			if vol.readOnly {
				return shimMount{}, configErrorf("subPath %q does not exist in volume %q", sub, vm.Name)
			}
			perm := fs.FileMode(0o755)
			if fi, err := os.Stat(vol.path); err == nil {
				perm = fi.Mode().Perm()
			}
			if err := os.MkdirAll(src, perm); err != nil {
				return shimMount{}, fmt.Errorf("create subPath %q: %w", sub, err)
			}
		}
		real, err := filepath.EvalSymlinks(src)
		base, berr := filepath.EvalSymlinks(vol.path)
		if err != nil || berr != nil || (real != base && !strings.HasPrefix(real, base+string(filepath.Separator))) {
			return shimMount{}, configErrorf("subPath %q leads outside volume %q", sub, vm.Name)
		}
		src = real
	}
	return shimMount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly || vol.readOnly}, nil
}
