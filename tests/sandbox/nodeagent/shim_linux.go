//go:build linux

package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The container shim. exec.Cmd cannot run code between clone and exec, and
// a container needs some: join the Pod's network namespace, build its root
// filesystem, change user. So the agent starts its own binary again
// (/proc/self/exe) with shimEnv set, in a new mount and UTS namespace; this
// package's init notices, sets the container up and execs its command. Any
// binary that imports the package — a test binary, the sandbox command —
// can therefore run containers.

// shimEnv carries the JSON shimSpec. It is never passed on to the container.
const shimEnv = "ETCDBACKUP_SANDBOX_CONTAINER_SHIM"

// Descriptors the agent hands the shim (exec.Cmd.ExtraFiles).
const (
	shimNetNSFD = 3 // the Pod's network namespace
	shimErrFD   = 4 // write end of the start-error pipe; closed by a successful exec
)

// shimStartFailure is the exit code of a container that could not be
// started, as containerd reports it (reason StartError).
const shimStartFailure = 128

// shimSpec is everything the shim needs to turn itself into the container.
type shimSpec struct {
	// Root is an empty host directory; the shim mounts a tmpfs on it (in its
	// private mount namespace only) and makes that the container's root.
	Root     string      `json:"root"`
	Hostname string      `json:"hostname"`
	Mounts   []shimMount `json:"mounts"`
	Argv     []string    `json:"argv"`
	Env      []string    `json:"env"`
	WorkDir  string      `json:"workDir"`
	UID      int         `json:"uid"`
	GID      int         `json:"gid"`
	Groups   []int       `json:"groups"`
	// NoNewPrivs is allowPrivilegeEscalation: false.
	NoNewPrivs   bool `json:"noNewPrivs"`
	ReadOnlyRoot bool `json:"readOnlyRoot"`
	// ParentPID is the agent's pid: the shim re-arms the parent-death signal
	// after changing user (which clears it) and checks the agent is alive.
	ParentPID int `json:"parentPID"`
}

// shimMount bind-mounts a host file or directory into the container.
type shimMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
}

func init() {
	spec, ok := os.LookupEnv(shimEnv)
	if !ok {
		return
	}
	// The main goroutine stays on the main thread: setns(CLONE_NEWNET)
	// changes only the calling thread, and the thread that calls execve is
	// the one whose namespaces the container gets.
	runtime.LockOSThread()
	os.Exit(runShim(spec))
}

// runShim returns only when the container could not be started.
func runShim(specJSON string) int {
	errPipe := os.NewFile(shimErrFD, "shim-errors")
	// A successful exec closes it, which tells the agent the container runs.
	unix.CloseOnExec(shimErrFD)
	fail := func(err error) int {
		_, _ = fmt.Fprint(errPipe, err.Error())
		return shimStartFailure
	}
	var spec shimSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fail(fmt.Errorf("decode container spec: %w", err))
	}
	if len(spec.Argv) == 0 {
		return fail(errors.New("no command to run"))
	}
	if err := unix.Setns(shimNetNSFD, unix.CLONE_NEWNET); err != nil {
		return fail(fmt.Errorf("join the pod's network namespace: %w", err))
	}
	_ = unix.Close(shimNetNSFD)
	if err := buildRootfs(&spec); err != nil {
		return fail(err)
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fail(fmt.Errorf("set hostname: %w", err))
	}
	workDir := spec.WorkDir
	if workDir == "" {
		workDir = "/"
	}
	// Like runc: a missing working directory is created (as root).
	if err := os.MkdirAll(workDir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, serr := os.Stat(workDir); serr != nil {
			return fail(fmt.Errorf("create working directory %s: %w", workDir, err))
		}
	}
	if err := setCredentials(&spec); err != nil {
		return fail(err)
	}
	if err := os.Chdir(workDir); err != nil {
		return fail(fmt.Errorf("change to working directory %s: %w", workDir, err))
	}
	path, err := lookPath(spec.Argv[0], spec.Env)
	if err != nil {
		return fail(err)
	}
	if spec.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fail(fmt.Errorf("set no_new_privs: %w", err))
		}
	}
	// Changing the user cleared the parent-death signal the agent asked for;
	// set it again, then make sure the agent did not die in between.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fail(fmt.Errorf("set parent-death signal: %w", err))
	}
	if os.Getppid() != spec.ParentPID {
		return fail(errors.New("the node agent is gone"))
	}
	err = unix.Exec(path, spec.Argv, spec.Env)
	return fail(fmt.Errorf("exec %q: %w", spec.Argv[0], err))
}

// buildRootfs makes spec.Root the root of this mount namespace: a tmpfs
// with the host's /usr and /lib* read-only (the loader and libc a dynamically
// linked binary needs), a few /etc files, minimal /dev, /proc, /sys and
// /tmp, then the container's own mounts (its binary, volumes, hosts file).
// Everything happens in the shim's private mount namespace (the clone made it
// with CLONE_NEWNS, and Go made "/" recursively private), so the host never
// sees any of it and nothing needs unmounting afterwards.
func buildRootfs(spec *shimSpec) error {
	root := spec.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64m"); err != nil {
		return fmt.Errorf("mount the container's root tmpfs on %s: %w", root, err)
	}
	for _, p := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		if err := mirrorHostPath(root, p); err != nil {
			return err
		}
	}
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		return fmt.Errorf("create /etc: %w", err)
	}
	for _, p := range []string{"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates", "/etc/localtime"} {
		if err := mirrorHostPath(root, p); err != nil {
			return err
		}
	}
	if err := buildDev(root); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(root, "proc"), 0o555); err != nil {
		return fmt.Errorf("create /proc: %w", err)
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := os.Mkdir(filepath.Join(root, "sys"), 0o555); err != nil {
		return fmt.Errorf("create /sys: %w", err)
	}
	if err := unix.Mount("sysfs", filepath.Join(root, "sys"), "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	tmp := filepath.Join(root, "tmp")
	if err := os.Mkdir(tmp, 0o777); err != nil {
		return fmt.Errorf("create /tmp: %w", err)
	}
	if err := os.Chmod(tmp, 0o777|fs.ModeSticky); err != nil {
		return fmt.Errorf("chmod /tmp: %w", err)
	}

	// Parents before children, so a volume mounted inside another volume's
	// path lands on top of it, not under it.
	mounts := slices.Clone(spec.Mounts)
	slices.SortStableFunc(mounts, func(a, b shimMount) int {
		return strings.Count(filepath.Clean(a.Target), "/") - strings.Count(filepath.Clean(b.Target), "/")
	})
	for _, m := range mounts {
		if err := bindInto(root, m); err != nil {
			return err
		}
	}

	old := filepath.Join(root, ".old-root")
	if err := os.Mkdir(old, 0o700); err != nil {
		return fmt.Errorf("create pivot directory: %w", err)
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	if err := unix.Unmount("/.old-root", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := os.Remove("/.old-root"); err != nil {
		return fmt.Errorf("remove pivot directory: %w", err)
	}
	if spec.ReadOnlyRoot {
		if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("make the root filesystem read-only: %w", err)
		}
	}
	return nil
}

// mirrorHostPath makes host path p appear read-only at the same path under
// root: a symlink is copied as a symlink (merged-/usr systems link /lib to
// usr/lib), a file or directory is bind-mounted. Missing paths are skipped.
func mirrorHostPath(root, p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("host %s: %w", p, err)
	}
	dst := filepath.Join(root, p)
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(p)
		if err != nil {
			return fmt.Errorf("read link %s: %w", p, err)
		}
		if err := os.Symlink(target, dst); err != nil {
			return fmt.Errorf("link %s: %w", p, err)
		}
		return nil
	}
	return bindInto(root, shimMount{Source: p, Target: p, ReadOnly: true})
}

// bindInto bind-mounts m.Source at m.Target under root, creating the mount
// point (a directory or an empty file, like the source) in the tmpfs.
func bindInto(root string, m shimMount) error {
	fi, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("mount source for %s: %w", m.Target, err)
	}
	dst := filepath.Join(root, filepath.Clean("/"+m.Target))
	if fi.IsDir() {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("create mount point directory for %s: %w", m.Target, err)
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
		f.Close()
	}
	if err := unix.Mount(m.Source, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s to %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		if err := remountReadOnly(dst); err != nil {
			return fmt.Errorf("make %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

// remountReadOnly makes a bind mount read-only, keeping the nosuid, nodev
// and noexec flags its source mount has (a remount that drops them fails).
func remountReadOnly(target string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for st_, ms := range map[int64]uintptr{unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV, unix.ST_NOEXEC: unix.MS_NOEXEC} {
		if st.Flags&st_ != 0 {
			flags |= ms
		}
	}
	return unix.Mount("", target, "", flags, "")
}

// buildDev makes a minimal /dev: the usual character devices bound from the
// host, the /proc/self/fd links and a /dev/shm tmpfs.
func buildDev(root string) error {
	dev := filepath.Join(root, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		return fmt.Errorf("create /dev: %w", err)
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bindInto(root, shimMount{Source: "/dev/" + d, Target: "/dev/" + d}); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("link /dev/%s: %w", name, err)
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o755); err != nil { // the tmpfs mounted on it sets 1777
		return fmt.Errorf("create /dev/shm: %w", err)
	}
	if err := unix.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=64m"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	return nil
}

// setCredentials switches to the container's user, group and supplementary
// groups (the syscall package applies them to every thread).
func setCredentials(spec *shimSpec) error {
	if err := syscall.Setgroups(spec.Groups); err != nil {
		return fmt.Errorf("set supplementary groups %v: %w", spec.Groups, err)
	}
	if err := syscall.Setgid(spec.GID); err != nil {
		return fmt.Errorf("set group %d: %w", spec.GID, err)
	}
	if err := syscall.Setuid(spec.UID); err != nil {
		return fmt.Errorf("set user %d: %w", spec.UID, err)
	}
	return nil
}

// lookPath resolves the command the way a container runtime does: a name
// with a slash is used as is, any other is searched in the container's
// PATH (not the agent's).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := imagePath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
}
