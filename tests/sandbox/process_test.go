package sandbox

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// A restart's port still held is waited for; one held on fails naming it.
func TestWaitPortFree(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = waitPortFree(ctx, "kube-apiserver", "127.0.0.1", port)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "kube-apiserver") || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("waitPortFree on a held port: %v", err)
	}

	released := time.AfterFunc(500*time.Millisecond, func() { ln.Close() })
	defer released.Stop()
	began := time.Now()
	if err := waitPortFree(context.Background(), "kube-apiserver", "127.0.0.1", port); err != nil {
		t.Fatalf("waitPortFree on a port released after 500ms: %v", err)
	}
	if waited := time.Since(began); waited < 400*time.Millisecond {
		t.Fatalf("waitPortFree returned after %s, before the port was released", waited)
	}
}
