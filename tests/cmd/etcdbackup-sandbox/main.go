// Command etcdbackup-sandbox runs the product on the local sandbox cluster:
// a real etcd, kube-apiserver, controller-manager and scheduler v1.37.2 and
// a real node (kubelet v1.37.2, containerd, kube-proxy, CoreDNS) in its own
// network and mount namespaces, with the product installed from manifests/
// and its images built from this repository.
//
//	etcdbackup-sandbox -demo            # `make demo`: the main job, step by step, then stop
//	etcdbackup-sandbox                  # `make sandbox`: keep it up for trying by hand
//	etcdbackup-sandbox -nodes 2 -ha     # `make sandbox NODES=2 HA=1`: two nodes, two replicas
//
// In sandbox mode it writes the admin kubeconfig to .sandbox/kubeconfig,
// puts kubectl and kubectl-etcdbackup in .sandbox/bin, and creates
// .sandbox/ready once everything is up. Ctrl-C or SIGTERM stops it all.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"

	ebsnapshot "github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

func main() {
	demo := flag.Bool("demo", false, "run the demo (snapshot, upload, list, download through the API server, verify) and exit")
	stateDir := flag.String("dir", ".sandbox", "where the kubeconfig, binaries, server storage and cluster state live")
	nodes := flag.Int("nodes", 1, "nodes of the cluster: 1, or 2 (the second joins like the first)")
	ha := flag.Bool("ha", false, "install the HA layout (manifests/components/ha): two server replicas, one leading the controller")
	flag.Parse()
	if *nodes != 1 && *nodes != 2 {
		fmt.Fprintf(os.Stderr, "-nodes %d: the sandbox runs 1 or 2 nodes\n", *nodes)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *stateDir, *demo, layout{nodes: *nodes, ha: *ha}); err != nil {
		fmt.Fprintln(os.Stderr, "\nerror:", err)
		os.Exit(1)
	}
}

type env struct {
	dir     string
	binDir  string
	sb      *sandbox.Sandbox
	product *world.Product
	kubectl *world.Kubectl
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

// layout is the cluster's shape: how many nodes, and whether the product
// runs as several replicas.
type layout struct {
	nodes int
	ha    bool
}

func run(ctx context.Context, stateDir string, demo bool, lay layout) error {
	dir, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	e := &env{dir: dir, binDir: filepath.Join(dir, "bin")}
	if err := os.MkdirAll(e.binDir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "ready"))

	step("Building kubectl-etcdbackup and the images etcdbackup-server, -agent and -cli from this repository")
	if err := world.BuildBinaries(ctx, e.binDir); err != nil {
		return err
	}
	images, err := world.BuildImages(ctx, filepath.Join(dir, "images"))
	if err != nil {
		return err
	}

	step("Starting the sandbox cluster: etcd (TLS), kube-apiserver, controller-manager, scheduler v1.37.2, and a node (kubelet v1.37.2, containerd, kube-proxy, CoreDNS) in its own namespaces at %s", sandbox.NodeIP)
	logf, err := os.Create(filepath.Join(dir, "sandbox.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	e.sb, err = sandbox.Start(ctx, sandbox.Config{
		Dir: filepath.Join(dir, "cluster"),
		Log: io.MultiWriter(logf, prefixed("    ")),
		// The node's containerd imports the images just built.
		Images: images.Archives,
		// One sandbox per machine: say which one runs rather than wait.
		NoWait: true,
		// The shipped NetworkPolicy is enforced, as in a cluster whose
		// CNI does, when this kernel can.
		NetworkPolicy: sandbox.CheckNetworkPolicy() == nil,
	})
	if err != nil {
		return err
	}
	defer func() {
		step("Stopping the sandbox")
		if e.product != nil {
			e.product.Stop()
		}
		_ = e.sb.Stop()
		_ = os.Remove(filepath.Join(dir, "ready"))
	}()
	if lay.nodes == 2 {
		step("Adding a second node, %s at %s, joined like the first", sandbox.Node2Name, sandbox.Node2IP)
		if _, err := e.sb.AddNode(ctx); err != nil {
			return err
		}
	}
	if err := linkFile(e.sb.KubectlPath(), filepath.Join(e.binDir, "kubectl")); err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := copyFile(e.sb.Kubeconfig(), kubeconfig); err != nil {
		return err
	}
	e.kubectl = &world.Kubectl{Path: filepath.Join(e.binDir, "kubectl"), Kubeconfig: kubeconfig, PluginDir: e.binDir}

	step("Installing etcdbackup from manifests/ with kubectl apply -k, as a user would")
	fmt.Printf("    overlay %s: target control-plane = the cluster's etcd (client cert in Secret etcd-client),\n", filepath.Join(dir, "overlay"))
	fmt.Printf("    locations default (filesystem on the PVC) and s3 (versitygw over HTTPS at %s)\n", world.S3ServiceName)
	if lay.ha {
		fmt.Println("    with manifests/components/ha: two replicas, a PodDisruptionBudget, the claim shared (ReadWriteMany)")
	}
	e.product, err = world.InstallProductWith(ctx, e.sb, e.kubectl, dir, prefixed("  "), world.ProductOptions{Images: images, HA: lay.ha})
	if err != nil {
		return err
	}
	if err := e.show(ctx, "get", "deploy,pods,svc,pvc", "-n", world.DefaultNamespace); err != nil {
		return err
	}

	if demo {
		return e.demo(ctx)
	}
	return e.serve(ctx)
}

func (e *env) demo(ctx context.Context) error {
	work := filepath.Join(e.dir, "demo")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	// Not the form of the target's scheduled backups, which users may
	// not take.
	name := "control-plane-demo-" + time.Now().UTC().Format("20060102-150405")
	step("Backing up the cluster's own etcd into S3: the server starts an agent Job")
	for _, args := range [][]string{
		{"etcdbackup", "version"},
		{"etcdbackup", "backup", "--target", "control-plane", "--location", "s3", "--name", name, "--wait"},
		{"get", "jobs,pods", "-n", world.DefaultNamespace, "-l", "app.kubernetes.io/component=backup-agent"},
		{"etcdbackup", "logs", name, "--location", "s3"},
		{"etcdbackup", "list", "--location", "s3", "-o", "wide"},
		{"etcdbackup", "verify", name, "--location", "s3"},
	} {
		if err := e.show(ctx, args...); err != nil {
			return err
		}
	}
	step("Downloading it through the API server and checking it with etcd's own tools")
	downloaded := filepath.Join(work, name+".db")
	if err := e.show(ctx, "etcdbackup", "download", name, "--location", "s3", "-o", downloaded); err != nil {
		return err
	}
	st, err := ebsnapshot.Check(downloaded)
	if err != nil {
		return fmt.Errorf("downloaded backup: %w", err)
	}
	fmt.Printf("    etcd's SHA-256 trailer and database check pass: revision %d, %d keys, %d bytes\n", st.Revision, st.TotalKey, st.TotalSize)

	step("Uploading a snapshot taken on this machine, and downloading it back")
	snap := filepath.Join(work, "snapshot.db")
	tlsCfg, err := e.sb.EtcdClientConfig()
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := snapshot.SaveWithVersion(sctx, zap.NewNop(), clientv3.Config{Endpoints: []string{e.sb.EtcdEndpoint()}, TLS: tlsCfg, DialTimeout: 10 * time.Second}, snap); err != nil {
		return fmt.Errorf("etcd snapshot: %w", err)
	}
	want, err := fileSHA256(snap)
	if err != nil {
		return err
	}
	fmt.Printf("    %s: sha256 %s\n", snap, want)
	for _, args := range [][]string{
		{"etcdbackup", "upload", snap, "--name", "uploaded-" + name, "--labels", "made-by=make-demo"},
		{"etcdbackup", "list"},
		{"etcdbackup", "download", "uploaded-" + name, "-o", filepath.Join(work, "uploaded.db")},
	} {
		if err := e.show(ctx, args...); err != nil {
			return err
		}
	}
	got, err := fileSHA256(filepath.Join(work, "uploaded.db"))
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("downloaded sha256 %s differs from the uploaded snapshot's %s", got, want)
	}
	fmt.Printf("    sha256 %s matches, byte for byte\n", got)

	step("Break-glass: reading the S3 location directly, as on the day the API server is down (no kubeconfig)")
	storage := filepath.Join(work, "storage.yaml")
	s3 := e.product.S3
	if err := os.WriteFile(storage, []byte(fmt.Sprintf(`# The locations: of the server's etcdbackup-config, with this machine's
# address of the store and credential files the operator holds.
locations:
  - name: s3
    s3:
      bucket: %s
      prefix: sandbox
      region: %s
      endpoint: %s
      pathStyle: true
      caBundleFile: %s
      accessKeyIDFile: %s
      secretAccessKeyFile: %s
`, s3.Bucket, s3.Region, s3.Endpoint, s3.CAFile, s3.AccessKeyIDFile, s3.SecretAccessKeyFile)), 0o600); err != nil {
		return err
	}
	offline := *e.kubectl
	offline.Env = []string{"KUBECONFIG=" + os.DevNull}
	for _, args := range [][]string{
		{"etcdbackup", "list", "--storage-config", storage, "-o", "wide"},
		{"etcdbackup", "verify", name, "--storage-config", storage},
	} {
		fmt.Printf("\n$ KUBECONFIG=/dev/null kubectl %s\n", strings.Join(args, " "))
		cmd := offline.Command(ctx, args...)
		cmd.Stdout, cmd.Stderr = prefixed("  "), prefixed("  ")
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
		}
	}
	step("The ledger: who stored and read each backup, the break-glass verify above included, hash-chained in each location")
	for _, args := range [][]string{
		{"etcdbackup", "audit", "--location", "s3"},
		{"etcdbackup", "audit", "--verify"},
	} {
		if err := e.show(ctx, args...); err != nil {
			return err
		}
	}
	fmt.Println("\nDemo complete: etcd was backed up into S3 by an agent Job, backups went up and came back down through the Kubernetes API server, the S3 location was read without it, and each location's ledger recorded who did what.")
	return nil
}

func (e *env) serve(ctx context.Context) error {
	if err := os.WriteFile(filepath.Join(e.dir, "ready"), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf(`
The sandbox is up. In another shell:

    export KUBECONFIG=%s PATH=%s:$PATH
    kubectl etcdbackup version
    kubectl etcdbackup backup --target control-plane --location s3 --wait
    kubectl etcdbackup list --location s3
    kubectl etcdbackup upload SOME-FILE --name my-backup
    kubectl etcdbackup list
    kubectl etcdbackup download my-backup -o /tmp/my-backup.db

Logs: %s (sandbox), and kubectl logs -n etcdbackup-system deploy/etcdbackup-server.
Press Ctrl-C to stop.
`, e.kubectl.Kubeconfig, e.binDir, filepath.Join(e.dir, "sandbox.log"))
	<-ctx.Done()
	return nil
}

// show prints a kubectl command as a user would type it, runs it and
// prints its output.
func (e *env) show(ctx context.Context, args ...string) error {
	fmt.Printf("\n$ kubectl %s\n", strings.Join(args, " "))
	cmd := e.kubectl.Command(ctx, args...)
	cmd.Stdout = prefixed("  ")
	cmd.Stderr = prefixed("  ")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

type prefixWriter struct {
	prefix string
	w      io.Writer
	bol    bool
}

func prefixed(p string) io.Writer { return &prefixWriter{prefix: p, w: os.Stdout, bol: true} }

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if p.bol {
			fmt.Fprint(p.w, p.prefix)
		}
		fmt.Fprint(p.w, line)
		p.bol = strings.HasSuffix(line, "\n")
	}
	return len(b), nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func linkFile(src, dst string) error {
	_ = os.Remove(dst)
	if err := os.Symlink(src, dst); err != nil {
		return fmt.Errorf("link %s: %w", dst, err)
	}
	return nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}
