//go:build !linux

package s3test

import "syscall"

func childSysProcAttr() *syscall.SysProcAttr { return nil }

// waitStopped cannot tell here: the signal takes effect when it does.
func waitStopped(int, bool) error { return nil }
