package main

import (
	"strings"
	"testing"
)

func TestUserListenMustBeLoopbackInPortForwardMode(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:50051", "[::1]:50051", "localhost:50051", "127.0.0.2:0"} {
		if err := checkUserListen(addr, ""); err != nil {
			t.Errorf("--listen %s: %v", addr, err)
		}
	}
	for _, addr := range []string{":50051", "0.0.0.0:50051", "[::]:50051", "10.244.1.7:50051", "etcdbackup:50051"} {
		for _, mode := range []string{"", "PortForward"} {
			err := checkUserListen(addr, mode)
			if err == nil {
				t.Errorf("--listen %s in mode %q: started", addr, mode)
				continue
			}
			for _, want := range []string{"--listen", addr, "not a loopback address", "PortForward", "checks no caller", "127.0.0.1:50051"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("--listen %s: %q does not say %q", addr, err, want)
				}
			}
		}
		if err := checkUserListen(addr, "SubjectAccessReview"); err != nil {
			t.Errorf("--listen %s in SubjectAccessReview mode: %v", addr, err)
		}
	}
	if err := checkUserListen("no-port", ""); err == nil || !strings.Contains(err.Error(), "--listen") {
		t.Errorf("--listen no-port: %v", err)
	}
}

// The refusal comes before the server opens anything: run fails on it.
func TestRunRefusesNonLoopbackListen(t *testing.T) {
	err := run([]string{"--listen=0.0.0.0:0", "--storage-dir=" + t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("run with --listen=0.0.0.0:0: %v", err)
	}
}
