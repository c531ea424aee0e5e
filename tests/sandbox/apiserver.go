package sandbox

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// apiserverProcess is a running kube-apiserver child process.
type apiserverProcess struct {
	cmd     *exec.Cmd
	url     string
	logPath string
	logFile *os.File
	exited  chan struct{} // closed once cmd.Wait returned
	waitErr error         // valid after exited is closed
}

// apiserverArgs are the flags that make a real kube-apiserver serve on
// loopback only, trust the sandbox's CAs and reach the node endpoint.
func apiserverArgs(dir string, p *pki, etcdURL string, port int) []string {
	return []string{
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"), // unused with explicit certs; keeps it out of /var/run
		"--tls-cert-file=" + p.apiserver.certFile,
		"--tls-private-key-file=" + p.apiserver.keyFile,
		"--client-ca-file=" + p.clientCA.certFile,
		"--etcd-servers=" + etcdURL,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPubFile,
		"--service-account-signing-key-file=" + p.saKeyFile,
		// Services get ClusterIPs from here; nothing routes to them.
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		// The kubelet connection: by the node's InternalIP (127.0.0.1), with
		// a client certificate the node endpoint checks, verifying the node
		// endpoint's serving certificate against the cluster CA.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + p.kubeletClient.certFile,
		"--kubelet-client-key=" + p.kubeletClient.keyFile,
		"--kubelet-certificate-authority=" + p.ca.certFile,
		"--profiling=false",
		// --advertise-address=127.0.0.1 is refused unless the endpoint
		// reconciler is off; leaving it unset lets the apiserver pick the
		// host's address for the "kubernetes" Service, which nothing uses.
		"--v=1",
	}
}

// startAPIServer runs kube-apiserver and waits until /readyz answers 200. A
// lost race for the picked port (another process bound it between our probe
// and the apiserver's bind) is retried with a new port.
func startAPIServer(ctx context.Context, binary, dir string, p *pki, etcdURL string, logw io.Writer) (*apiserverProcess, error) {
	const attempts = 3
	var lastErr error
	for i := 0; i < attempts; i++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		proc, err := launchAPIServer(binary, dir, p, etcdURL, port)
		if err != nil {
			return nil, err
		}
		err = proc.waitReady(ctx, p)
		if err == nil {
			return proc, nil
		}
		proc.stop()
		lastErr = err
		if !proc.lostPortRace() || ctx.Err() != nil {
			break
		}
		fmt.Fprintf(logw, "sandbox: port %d was taken, retrying kube-apiserver on another port\n", port)
	}
	return nil, lastErr
}

func launchAPIServer(binary, dir string, p *pki, etcdURL string, port int) (*apiserverProcess, error) {
	logPath := filepath.Join(dir, "kube-apiserver.log")
	// Append: a retried start keeps the first attempt's output for diagnosis.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open apiserver log: %w", err)
	}
	cmd := exec.Command(binary, apiserverArgs(dir, p, etcdURL, port)...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Only what the apiserver needs; a developer's KUBECONFIG or proxy
	// settings must not leak into it.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	cmd.SysProcAttr = childSysProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	proc := &apiserverProcess{
		cmd:     cmd,
		url:     "https://127.0.0.1:" + strconv.Itoa(port),
		logPath: logPath,
		logFile: logFile,
		exited:  make(chan struct{}),
	}
	// The reaper: owned by the process, ends when it exits.
	go func() {
		proc.waitErr = cmd.Wait()
		logFile.Close()
		close(proc.exited)
	}()
	return proc, nil
}

// waitReady polls /readyz as the admin until it answers 200, the process
// exits, or ctx ends.
func (a *apiserverProcess) waitReady(ctx context.Context, p *pki) error {
	cert, err := tls.X509KeyPair(p.admin.certPEM, p.admin.keyPEM)
	if err != nil {
		return fmt.Errorf("admin cert: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.cert)
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * time.Second}

	deadline := time.NewTimer(90 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("readyz request: %w", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, failingChecks(body))
		} else {
			last = err.Error()
		}
		select {
		case <-a.exited:
			return fmt.Errorf("kube-apiserver exited before ready (%v); last lines of %s:\n%s", a.waitErr, a.logPath, a.logTail(20))
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-apiserver /readyz (last: %s): %w", last, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("kube-apiserver not ready after 90s (last: %s); see %s", last, a.logPath)
		case <-tick.C:
		}
	}
}

// failingChecks picks the "[-]... failed" lines out of a /readyz body.
func failingChecks(body []byte) string {
	var failed []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "[-]") {
			failed = append(failed, strings.TrimSpace(line))
		}
	}
	if len(failed) == 0 {
		return strings.TrimSpace(string(body))
	}
	return strings.Join(failed, "; ")
}

// lostPortRace tells whether the process died because its port was taken.
func (a *apiserverProcess) lostPortRace() bool {
	select {
	case <-a.exited:
	default:
		return false
	}
	return strings.Contains(a.logTail(50), "address already in use")
}

func (a *apiserverProcess) logTail(n int) string {
	data, err := os.ReadFile(a.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// stop asks the apiserver to shut down gracefully (SIGTERM), and kills it if
// it has not exited in time. It returns once the process is reaped.
func (a *apiserverProcess) stop() error {
	select {
	case <-a.exited:
		return nil
	default:
	}
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = a.cmd.Process.Kill()
	}
	select {
	case <-a.exited:
		return nil
	case <-time.After(15 * time.Second):
	}
	if err := a.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill kube-apiserver (pid %d): %w", a.cmd.Process.Pid, err)
	}
	<-a.exited
	return nil
}

// freePort asks the kernel for a free loopback port. The port is released
// before the caller binds it, so a race is possible; callers that can tell
// (the apiserver) retry.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
