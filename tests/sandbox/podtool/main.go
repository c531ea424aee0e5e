// Command podtool is a small stand-in image for the sandbox's tests: the
// node agent runs it for test images as it runs the project's binaries for
// the project's images. Each mode exercises something a Pod does.
//
//	podtool serve [--listen :8080]      HTTP: "/" answers "pod=NAME host=HOSTNAME", /healthz "ok"
//	podtool exit [--code N] [--message M] [--stderr M]   print, then exit with N
//	podtool sleep                       until SIGTERM, then exit 0
//	podtool get URL                     HTTP GET URL (Service names resolve through /etc/hosts), print the body
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
