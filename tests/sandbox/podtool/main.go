// Command podtool is the sandbox's test image: a static binary the tests
// pack as an image and run in pods on the sandbox's node. Each mode
// exercises something a Pod does.
//
//	podtool serve [--listen :8080]      HTTP: "/" answers "pod=NAME host=HOSTNAME", /healthz "ok"
//	podtool bytes [--listen :8080] --size N   TCP: write N bytes to every connection, then close it
//	podtool exit [--code N] [--message M] [--stderr M]   print, then exit with N
//	podtool sleep                       until SIGTERM, then exit 0
//	podtool get URL                     HTTP GET URL (Service names resolve through cluster DNS), print the body
//	podtool incluster                   in-cluster client-go config: who am I to the API server
//	podtool inspect [--env NAME]... [--file PATH]... [--write DIR]...   print identity, env, files; try writes
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: podtool serve|exit|sleep|get|incluster|inspect [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	mode, args := os.Args[1], os.Args[2:]
	var err error
	switch mode {
	case "serve":
		err = serve(ctx, args)
	case "bytes":
		err = bytesSource(ctx, args)
	case "exit":
		err = exit(args)
	case "sleep":
		fmt.Println("sleeping until SIGTERM")
		<-ctx.Done()
		fmt.Println("got SIGTERM, exiting")
	case "get":
		err = get(ctx, args)
	case "incluster":
		err = incluster(ctx)
	case "inspect":
		err = inspect(args)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podtool:", err)
		os.Exit(1)
	}
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "pod=%s host=%s\n", os.Getenv("POD_NAME"), host)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Printf("serving on %s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// bytesSource is a raw byte source: the tunnel benchmark's baseline reads
// it through a port-forward, with nothing of the product in the path.
func bytesSource(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bytes", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address")
	size := fs.Int64("size", 1<<30, "bytes per connection")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Printf("writing %d bytes to each connection on %s\n", *size, ln.Addr())
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	// An odd period, so the stream never repeats in step with a buffer.
	chunk := make([]byte, 256<<10+4093)
	for i := range chunk {
		chunk[i] = byte(i*7 + i>>8)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			for left := *size; left > 0; {
				n, err := c.Write(chunk[:min(int64(len(chunk)), left)])
				if err != nil {
					return
				}
				left -= int64(n)
			}
		}()
	}
}

func exit(args []string) error {
	fs := flag.NewFlagSet("exit", flag.ContinueOnError)
	code := fs.Int("code", 0, "exit code")
	msg := fs.String("message", "", "line for stdout")
	errMsg := fs.String("stderr", "", "line for stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *msg != "" {
		fmt.Println(*msg)
	}
	if *errMsg != "" {
		fmt.Fprintln(os.Stderr, *errMsg)
	}
	os.Exit(*code)
	return nil
}

func get(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("get URL")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	fmt.Printf("GET %s: %s %s", args[0], resp.Status, body)
	return nil
}

// incluster does what an in-cluster client does first: config from the
// service-account token, CA and KUBERNETES_SERVICE_HOST/PORT, then a call.
func incluster(ctx context.Context) error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("self subject review via %s: %w", cfg.Host, err)
	}
	fmt.Printf("in-cluster via %s: I am %s (pod %v)\n", cfg.Host, r.Status.UserInfo.Username, r.Status.UserInfo.Extra["authentication.kubernetes.io/pod-name"])
	return nil
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func inspect(args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var envs, files, writes multi
	fs.Var(&envs, "env", "variable to print")
	fs.Var(&files, "file", "file to print")
	fs.Var(&writes, "write", "directory to try writing to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	host, _ := os.Hostname()
	groups, _ := os.Getgroups()
	fmt.Printf("uid=%d gid=%d groups=%v hostname=%s\n", os.Getuid(), os.Getgid(), groups, host)
	for _, e := range envs {
		v, ok := os.LookupEnv(e)
		fmt.Printf("env %s=%q set=%v\n", e, v, ok)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Printf("file %s: error %v\n", f, err)
			continue
		}
		fmt.Printf("file %s: %q\n", f, strings.TrimSpace(string(b)))
	}
	for _, d := range writes {
		err := os.WriteFile(d+"/podtool-probe", []byte("x"), 0o644)
		if err == nil {
			fmt.Printf("write %s: ok\n", d)
		} else {
			fmt.Printf("write %s: error %v\n", d, err)
		}
	}
	return nil
}
