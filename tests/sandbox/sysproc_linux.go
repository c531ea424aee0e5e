package sandbox

import "syscall"

// childSysProcAttr makes the kernel kill the apiserver if the process that
// started it dies without calling Stop (a test binary killed by a timeout, a
// Ctrl-C'd demo), so no kube-apiserver is ever orphaned.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
