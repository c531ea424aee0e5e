package sandbox

import (
	"bytes"
	"context"
	"crypto/tls"
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

// process is a running binary of the cluster (kube-apiserver,
// kube-controller-manager, kube-scheduler, and the node's containerd,
// kubelet and kube-proxy) with its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once cmd.Wait returned
	waitErr error         // valid after exited is closed
}

// component says how to run one control-plane binary.
type component struct {
	name   string // binary name, also the log file's
	host   string // address it serves on; default 127.0.0.1
	binary string
	dir    string // working directory and where NAME.log goes
	// port, when set, is the secure port to serve on (a restart keeps the
	// port clients know); 0 has startComponent pick a free one.
	port int
	// args builds the flags for the secure port.
	args func(port int) []string
	// health is the path polled until it answers 200 (e.g. /readyz).
	health string
	tls    *tls.Config // client TLS config for polling health
}

// startComponent runs c and waits until its health endpoint answers 200.
// A lost race for a picked port (another process bound it between our
// probe and the component's bind) is retried with a new port; a fixed
// port (c.port) still taken is waited for, up to portBusyTimeout, and then
// fails naming it. It returns the process and the https://HOST:PORT it
// serves on.
func startComponent(ctx context.Context, c component, logw io.Writer) (*process, string, error) {
	const attempts = 3
	host := c.host
	if host == "" {
		host = "127.0.0.1"
	}
	var lastErr error
	for i := 0; i < attempts; i++ {
		port := c.port
		if port == 0 {
			var err error
			if port, err = freePort(); err != nil {
				return nil, "", err
			}
		} else if err := waitPortFree(ctx, c.name, host, port); err != nil {
			return nil, "", err
		}
		proc, err := launch(c.name, c.binary, c.dir, c.args(port))
		if err != nil {
			return nil, "", err
		}
		url := fmt.Sprintf("https://%s:%d", host, port)
		err = proc.waitHealthy(ctx, url+c.health, c.tls)
		if err == nil {
			return proc, url, nil
		}
		_ = proc.stop(15 * time.Second)
		lastErr = err
		if !proc.lostPortRace() || ctx.Err() != nil {
			break
		}
		if c.port == 0 {
			fmt.Fprintf(logw, "sandbox: port %d was taken, retrying %s on another port\n", port, c.name)
		} else {
			fmt.Fprintf(logw, "sandbox: port %d was taken, retrying %s on it\n", port, c.name)
		}
	}
	return nil, "", lastErr
}

// waitPortFree waits until host:port can be bound, for at most
// portBusyTimeout: the port a component served on before a restart, which
// its clients keep using.
func waitPortFree(ctx context.Context, name, host string, port int) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	deadline := time.Now().Add(portBusyTimeout)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln.Close()
		}
		if !addrInUse(err) {
			return fmt.Errorf("%s: check port %s: %w", name, addr, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: its port %s is still in use after %s; another process holds it (see `ss -tlnp`): %w", name, addr, portBusyTimeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for its port %s to be free: %w", name, addr, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func launch(name, binary, dir string, args []string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	// Append: a retried start keeps the first attempt's output for diagnosis.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Only what the component needs; a developer's KUBECONFIG or proxy
	// settings must not leak into it.
	cmd.Env = []string{"PATH=" + nodePATH, "HOME=" + dir}
	cmd.SysProcAttr = childSysProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	// The reaper: owned by the process, ends when it exits.
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	return p, nil
}

// waitHealthy polls url until it answers 200, the process exits, or ctx
// ends (90 s at most).
func (p *process) waitHealthy(ctx context.Context, url string, tlsConfig *tls.Config) error {
	tr := &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * time.Second}

	deadline := time.NewTimer(90 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("%s health request: %w", p.name, err)
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
		case <-p.exited:
			return fmt.Errorf("%s exited before ready (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.logTail(20))
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s %s (last: %s): %w", p.name, url, last, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("%s not ready after 90s (last: %s); see %s", p.name, last, p.logPath)
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
func (p *process) lostPortRace() bool {
	select {
	case <-p.exited:
	default:
		return false
	}
	return strings.Contains(p.logTail(50), "address already in use")
}

func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// stop asks the process to shut down gracefully (SIGTERM) and kills it if
// it has not exited within grace. It returns once the process is reaped.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s (pid %d): %w", p.name, p.cmd.Process.Pid, err)
	}
	<-p.exited
	return nil
}

// freePort asks the kernel for a free loopback port. The port is released
// before the caller binds it, so a race is possible; startComponent
// retries.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
