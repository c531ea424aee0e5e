//go:build !linux

package sandbox

import "syscall"

// childSysProcAttr: no parent-death signal outside Linux; Stop still reaps
// the apiserver.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
