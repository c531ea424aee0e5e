// Command sandbox starts the test sandbox (a real kube-apiserver with etcd
// and a port-forwarding node endpoint on loopback) and keeps it up until
// interrupted, for trying the plugin by hand:
//
//	make kube-bins
//	go run ./tests/sandbox/cmd/sandbox -dir /tmp/etcdbackup-sandbox
//	export KUBECONFIG=/tmp/etcdbackup-sandbox/kubeconfig
//
// With -echo, it also runs a TCP echo server and a pod
// (etcdbackup-system/etcdbackup-server-demo, port 7443 named grpc) whose
// port-forwards reach it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

func main() {
	dir := flag.String("dir", "", "work dir (default: a new temp dir)")
	binDir := flag.String("bin-dir", "", "dir with kube-apiserver and kubectl (default: $"+sandbox.BinDirEnv+" or <repo>/.cache/kube/bin)")
	withEcho := flag.Bool("echo", false, "also run an echo pod (etcdbackup-system/etcdbackup-server-demo:7443)")
	flag.Parse()
	if err := run(*dir, *binDir, *withEcho); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
}

func run(dir, binDir string, withEcho bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if dir == "" {
		d, err := os.MkdirTemp("", "etcdbackup-sandbox-")
		if err != nil {
			return err
		}
		dir = d
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	s, err := sandbox.Start(startCtx, sandbox.Config{Dir: dir, BinDir: binDir, Log: os.Stderr})
	cancel()
	if err != nil {
		return err
	}
	defer s.Stop()

	if withEcho {
		addr, closeEcho, err := echoServer()
		if err != nil {
			return err
		}
		defer closeEcho()
		err = s.RunPod(ctx, sandbox.PodSpec{
			Namespace: "etcdbackup-system",
			Name:      "etcdbackup-server-demo",
			Labels:    map[string]string{"app.kubernetes.io/name": "etcdbackup-server"},
			Ports:     []corev1.ContainerPort{{Name: "grpc", ContainerPort: 7443}},
			Targets:   map[int32]string{7443: addr},
			Ready:     true,
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "sandbox: echo pod etcdbackup-system/etcdbackup-server-demo:7443 -> %s\n", addr)
	}
	fmt.Printf("export KUBECONFIG=%s\n", s.Kubeconfig())
	fmt.Fprintf(os.Stderr, "sandbox: kubectl %s; Ctrl-C to stop\n", s.KubectlPath())
	<-ctx.Done()
	return s.Stop()
}

// echoServer runs a TCP echo server on loopback; the returned func stops it
// and waits for its goroutines.
func echoServer() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	return ln.Addr().String(), func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}, nil
}
