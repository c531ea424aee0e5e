//go:build linux

package nodeagent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// containerRun is one execution of a container: what a container runtime
// calls a container (a restart is a new run, with a new log file).
type containerRun struct {
	id        string
	pid       int
	startedAt time.Time
	logPath   string

	done chan struct{} // closed once the process exited and its output is in the log

	// Valid after done is closed.
	exitCode   int32
	signaled   bool
	finishedAt time.Time
	// startErr is set when the shim could not start the command (exit code
	// 128, reason StartError, as containerd reports it).
	startErr string
}

// running tells whether the process has not exited yet.
func (r *containerRun) running() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the container's process group: the container's
// processes, like a runtime signals its init and the kernel its PID
// namespace.
func (r *containerRun) signal(sig syscall.Signal) {
	_ = syscall.Kill(-r.pid, sig)
}

// startContainer starts the shim for spec inside ns, with stdout and stderr
// going to logPath in the CRI log format, and returns once the container's
// command runs — or failed to start, in which case the returned run is
// already done and carries startErr. onExit is called (from the run's own
// goroutine, which the returned WaitGroup counts) after done is closed.
func startContainer(id string, spec *shimSpec, ns *netNS, logPath string, wg *sync.WaitGroup, onExit func(*containerRun)) (*containerRun, error) {
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode container spec: %w", err)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open container log: %w", err)
	}
	var pipes []*os.File
	closeAll := func() {
		for _, f := range pipes {
			f.Close()
		}
	}
	newPipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err == nil {
			pipes = append(pipes, r, w)
		}
		return r, w, err
	}
	outR, outW, err1 := newPipe()
	errR, errW, err2 := newPipe()
	startR, startW, err3 := newPipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		closeAll()
		logFile.Close()
		return nil, fmt.Errorf("container pipes: %w", err)
	}

	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"sandbox-container-shim"}
	cmd.Env = []string{shimEnv + "=" + string(specJSON)}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, so Stop and kill reach whatever the
		// container forks; killed with the agent if the agent dies.
		Setpgid:      true,
		Pdeathsig:    syscall.SIGKILL,
		Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
	}
	err = ns.withFile(func(f *os.File) error {
		cmd.ExtraFiles = []*os.File{f, startW}
		return cmd.Start()
	})
	// The child has its copies; the parent's write ends must go, or the
	// readers would never see EOF.
	outW.Close()
	errW.Close()
	startW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		startR.Close()
		logFile.Close()
		return nil, fmt.Errorf("start container shim: %w", err)
	}

	run := &containerRun{id: id, pid: cmd.Process.Pid, startedAt: time.Now(), logPath: logPath, done: make(chan struct{})}
	lw := &criLogWriter{f: logFile}
	var copiers sync.WaitGroup
	copiers.Add(2)
	go func() { defer copiers.Done(); lw.copy("stdout", outR) }()
	go func() { defer copiers.Done(); lw.copy("stderr", errR) }()

	// EOF on the start pipe: the exec happened (close-on-exec) or the shim
	// exited; anything written is the shim's reason for failing. The
	// deadline only guards against a shim that hangs while setting up.
	_ = startR.SetReadDeadline(time.Now().Add(30 * time.Second))
	msg, rerr := io.ReadAll(io.LimitReader(startR, 64<<10))
	startR.Close()
	if rerr != nil && len(msg) == 0 {
		msg = []byte("container shim did not start the command: " + rerr.Error())
		_ = syscall.Kill(-run.pid, syscall.SIGKILL)
	}
	if len(msg) > 0 {
		run.startErr = strings.TrimSpace(string(msg))
	}

	wg.Add(1)
	go func() {
		defer wg.Done()
		state, werr := cmd.Process.Wait()
		// Like a PID namespace whose init exited: nothing of the container
		// survives its main process.
		_ = syscall.Kill(-run.pid, syscall.SIGKILL)
		// Output still in the pipes goes to the log; a descendant that
		// escaped the process group and holds a pipe open is not waited for
		// long.
		drained := make(chan struct{})
		go func() { copiers.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			outR.Close()
			errR.Close()
			<-drained
		}
		logFile.Close()
		run.finishedAt = time.Now()
		switch {
		case werr != nil:
			run.exitCode = 128
			if run.startErr == "" {
				run.startErr = "wait for container: " + werr.Error()
			}
		default:
			ws := state.Sys().(syscall.WaitStatus)
			if ws.Signaled() {
				run.signaled = true
				run.exitCode = 128 + int32(ws.Signal())
			} else {
				run.exitCode = int32(ws.ExitStatus())
			}
		}
		close(run.done)
		onExit(run)
	}()
	return run, nil
}

// criLogWriter writes a container's output in the CRI log format the
// kubelet reads ("TIMESTAMP STREAM TAG CONTENT"; tag F for a full line, P
// for a part of a longer one), both streams into one file.
type criLogWriter struct {
	mu sync.Mutex
	f  *os.File
}

// maxLogLine is the longest line written as one entry, like containerd's
// default max_container_log_line_size.
const maxLogLine = 16 << 10

func (w *criLogWriter) copy(stream string, r io.ReadCloser) {
	defer r.Close()
	br := bufio.NewReaderSize(r, maxLogLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			switch {
			case line[len(line)-1] == '\n':
				w.write(stream, "F", line[:len(line)-1])
			case errors.Is(err, bufio.ErrBufferFull):
				w.write(stream, "P", line)
			default: // the last line, without its newline
				w.write(stream, "F", line)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func (w *criLogWriter) write(stream, tag string, content []byte) {
	var b strings.Builder
	b.Grow(len(content) + 48)
	b.WriteString(time.Now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(stream)
	b.WriteByte(' ')
	b.WriteString(tag)
	b.WriteByte(' ')
	b.Write(content)
	b.WriteByte('\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	// A failed write loses log lines, never the container.
	_, _ = io.WriteString(w.f, b.String())
}
