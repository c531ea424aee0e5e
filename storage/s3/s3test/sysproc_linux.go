package s3test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// childSysProcAttr makes the kernel kill versitygw if the test process dies
// without stopping it (a test binary killed by its timeout).
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits until every thread of pid is stopped (SIGSTOP) or
// none is (SIGCONT): kill(2) returns before the signal takes effect, and a
// request sent in between may still be answered.
func waitStopped(pid int, stopped bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			return fmt.Errorf("threads of process %d: %v", pid, err)
		}
		done := true
		for _, task := range tasks {
			b, err := os.ReadFile(task)
			if err != nil {
				continue // a thread that exited
			}
			// The state follows the command name, which is in parentheses.
			_, rest, ok := strings.Cut(string(b), ") ")
			if ok && (rest[0] == 'T') != stopped {
				done = false
				break
			}
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d: not %s within 10s", pid, map[bool]string{true: "stopped", false: "running again"}[stopped])
		}
		time.Sleep(time.Millisecond)
	}
}
