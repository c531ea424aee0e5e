// Command pause is the test sandbox's pod sandbox image: the process that
// holds a pod's namespaces open. It blocks until SIGTERM or SIGINT and, as
// PID 1 of a pod that shares its process namespace, reaps orphaned children
// so they never pile up as zombies — the job of registry.k8s.io/pause, which
// cannot be pulled here.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: pause (takes no arguments; stops on SIGTERM or SIGINT)")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: shutting down on %v\n", sig)
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking; several exits may share
// one SIGCHLD.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
