// Package world assembles the product on the test sandbox: it builds the
// project's binaries and images, runs the data server as a process for
// tests without a cluster, installs the product into the sandbox cluster
// from manifests/ with the real kubectl (the node runs the images), and
// runs the real kubectl with the real plugin on its PATH.
// The end-to-end tests, benchmarks, `make demo` and `make sandbox` share it.
package world

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

const (
	// ServerPort is the server's container port, named "grpc".
	ServerPort = 50051
	// DefaultNamespace is where the product installs by default.
	DefaultNamespace = "etcdbackup-system"
	// PluginBinary and ServerBinary are the names BuildBinaries produces.
	PluginBinary = "kubectl-etcdbackup"
	ServerBinary = "etcdbackup-server"
	AgentBinary  = "etcdbackup-agent"
)

// RepoRoot finds the repository root by walking up to go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "cmd", PluginBinary)); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root not found above the working directory")
		}
		dir = parent
	}
}

// BuildBinaries builds the plugin and the server from this repository into
// dir with `go build`, as a user's `make` would.
func BuildBinaries(ctx context.Context, dir string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"./cmd/"+PluginBinary, "./cmd/"+ServerBinary, "./cmd/"+AgentBinary)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
}

// FreeAddr returns a loopback address with a port free at the moment.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// ServerProcess is a running etcdbackup-server.
type ServerProcess struct {
	Addr       string
	StorageDir string
	cmd        *exec.Cmd
	done       chan struct{}
	waitErr    error
	stopOnce   sync.Once
}

// StartServer runs the server binary on a free loopback port over
// storageDir and waits until it accepts connections.
func StartServer(ctx context.Context, binDir, storageDir string, logw io.Writer) (*ServerProcess, error) {
	p, err := StartServerArgs(ctx, binDir, logw, "--storage-dir", storageDir)
	if p != nil {
		p.StorageDir = storageDir
	}
	return p, err
}

// StartServerArgs runs the server binary with extra args (such as
// --config FILE) on a free loopback port.
func StartServerArgs(ctx context.Context, binDir string, logw io.Writer, args ...string) (*ServerProcess, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	if logw == nil {
		logw = io.Discard
	}
	cmd := exec.Command(filepath.Join(binDir, ServerBinary), append([]string{"--listen", addr, "--shutdown-timeout", "10s"}, args...)...)
	cmd.Stdout, cmd.Stderr = logw, logw
	// Die with the test process: no orphan server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", ServerBinary, err)
	}
	p := &ServerProcess{Addr: addr, cmd: cmd, done: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited before serving: %v", ServerBinary, p.waitErr)
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s did not listen on %s within 30s", ServerBinary, addr)
		}
	}
}

// Stop sends SIGTERM (the server drains) and waits; SIGKILL after 15 s.
func (p *ServerProcess) Stop() error {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	var exit *exec.ExitError
	if errors.As(p.waitErr, &exit) && exit.Exited() {
		return fmt.Errorf("%s exited with %d", ServerBinary, exit.ExitCode())
	}
	return nil
}

// InstallServer installs the product from manifests/ into namespace ns
// with `kubectl apply -k` of an overlay (written under dir) that changes
// nothing but the namespace and the images' names, then waits for
// the server Deployment to be Available.
func InstallServer(ctx context.Context, sb *sandbox.Sandbox, k *Kubectl, ns string, images *Images, dir string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	overlay := filepath.Join(dir, "overlay-"+ns)
	if err := os.MkdirAll(overlay, 0o700); err != nil {
		return err
	}
	base, err := filepath.Rel(overlay, filepath.Join(root, "manifests"))
	if err != nil {
		return err
	}
	name, tag := nameAndTag(images.Server)
	agentName, agentTag := nameAndTag(images.Agent)
	kust := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
  - %s
images:
  - name: etcdbackup-server
    newName: %s
    newTag: %q # quoted: a tag such as a commit hash can be all digits
  - name: etcdbackup-agent
    newName: %s
    newTag: %q
`, ns, base, name, tag, agentName, agentTag)
	if ns != DefaultNamespace {
		// The one cluster-scoped object bound to the namespace gets a name
		// of its own, as docs/security.md tells a second install to do.
		kust += fmt.Sprintf(`patches:
  - target: {kind: ClusterRoleBinding, name: etcdbackup-server-auth-delegator}
    patch: |-
      - op: replace
        path: /metadata/name
        value: etcdbackup-server-auth-delegator-%s
`, ns)
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o600); err != nil {
		return err
	}
	if r := k.Run(ctx, "apply", "-k", overlay); r.ExitCode != 0 {
		return fmt.Errorf("kubectl apply -k %s: %s", overlay, r)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := sb.WaitForDeploymentAvailable(wctx, ns, "etcdbackup-server"); err != nil {
		return err
	}
	// Agents reach the server by its Service.
	return sb.WaitForServiceRouted(wctx, ns, "etcdbackup")
}

// Kubectl runs the sandbox's real kubectl with the plugin's directory first
// on PATH, so `kubectl etcdbackup` finds the plugin the way it would on a
// user's machine.
type Kubectl struct {
	Path       string
	Kubeconfig string
	PluginDir  string
	Env        []string
}

// Command returns the exec.Cmd for `kubectl ARGS...`.
func (k *Kubectl) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, k.Path, args...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+k.Kubeconfig,
		"PATH="+k.PluginDir+string(os.PathListSeparator)+filepath.Dir(k.Path)+string(os.PathListSeparator)+os.Getenv("PATH"),
	)
	cmd.Env = append(cmd.Env, k.Env...)
	return cmd
}

// Result is what a command printed and how it ended.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
}

func (r Result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.ExitCode, r.Stdout, r.Stderr)
}

// Run runs `kubectl ARGS...` and collects its output.
func (k *Kubectl) Run(ctx context.Context, args ...string) Result {
	return RunCommand(k.Command(ctx, args...))
}

// RunCommand runs cmd and collects its output.
func RunCommand(cmd *exec.Cmd) Result {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.ExitCode = exit.ExitCode()
	case err != nil:
		r.ExitCode = -1
		r.Stderr += err.Error()
	}
	return r
}

// PeakRSSKiB returns ru_maxrss of a finished command. On Linux it counts
// the parent's RSS at the moment of the fork too (Go forks with vfork and
// execs), so it is an upper bound; sample VmHWM while a process runs for
// its own peak.
func PeakRSSKiB(cmd *exec.Cmd) int64 {
	if cmd.ProcessState == nil {
		return 0
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss
	}
	return 0
}

// ReadStatusValue reads a "Key:  value kB" line from /proc/PID/status.
func ReadStatusValue(pid int, key string) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			fields := strings.Fields(v)
			if len(fields) > 0 {
				return strconv.ParseInt(fields[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%d/status", key, pid)
}

// PeakRSSKiB is the server process's peak resident set size so far
// (VmHWM), while it runs.
func (p *ServerProcess) PeakRSSKiB() int64 {
	v, _ := ReadStatusValue(p.cmd.Process.Pid, "VmHWM")
	return v
}

// Shell runs script with bash (pipefail), in the environment Command gives
// kubectl: the plugin and kubectl on PATH, KUBECONFIG set — a user's
// shell, for documented command lines.
func (k *Kubectl) Shell(ctx context.Context, script string) *exec.Cmd {
	cmd := k.Command(ctx)
	cmd.Path, cmd.Err = "/bin/bash", nil
	cmd.Args = []string{"bash", "-o", "pipefail", "-c", script}
	return cmd
}
