//go:build !linux

package s3test

import "syscall"

func childSysProcAttr() *syscall.SysProcAttr { return nil }
