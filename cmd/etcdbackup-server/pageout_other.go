//go:build !linux

package main

// releaseBinaryPages is Linux's only.
func releaseBinaryPages() error { return nil }
