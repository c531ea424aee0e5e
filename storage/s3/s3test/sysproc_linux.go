package s3test

import "syscall"

// childSysProcAttr makes the kernel kill versitygw if the test process dies
// without stopping it (a test binary killed by its timeout).
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
