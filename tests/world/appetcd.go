package world

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tunnel"
)

// An application's etcd cluster in the sandbox, the kind a ClusterTarget
// names: AppEtcdMembers members, each a Deployment of etcd's own server
// (AppEtcdImage) with its own PVC and ClusterIP Service, in their own
// namespace, as the restore tests and the cluster restore benchmark run
// it.
const (
	// AppEtcdImage is etcd's own server main (tests/cmd/etcd) as an
	// image; BuildEtcd builds its binary for sandbox.LoadBinaryImage.
	AppEtcdImage   = "sandbox.local/etcd:e2e"
	AppEtcdMembers = 3
	// AppEtcdDataDir is each member's data directory inside its volume,
	// mounted at AppEtcdMountPath.
	AppEtcdDataDir   = "data"
	AppEtcdMountPath = "/var/lib/etcd"
)

// BuildEtcd builds etcd's own server main (tests/cmd/etcd), static, into
// dir and returns its path.
func BuildEtcd(ctx context.Context, dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "etcd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./tests/cmd/etcd")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./tests/cmd/etcd: %v\n%s", err, b)
	}
	return out, nil
}

// AppMember is member i of the application etcd in namespace ns: etcd-i,
// reached at its Service, its data in PVC data-etcd-i.
func AppMember(ns string, i int) ClusterMember {
	n := fmt.Sprintf("etcd-%d", i)
	return ClusterMember{
		Name:      n,
		PeerURL:   fmt.Sprintf("http://%s.%s.svc:2380", n, ns),
		ClientURL: fmt.Sprintf("http://%s.%s.svc:2379", n, ns),
		DataDir:   AppEtcdDataDir,
		ClaimName: "data-" + n,
	}
}

// AppEtcdYAML is the YAML of the application etcd in namespace ns with
// the given members and cluster token, plus what the etcdbackup server
// (in DefaultNamespace) needs there to run restore Jobs: the agents'
// ServiceAccount and the server's Role.
func AppEtcdYAML(ns, token string, members []ClusterMember) string {
	var ic []string
	for _, m := range members {
		ic = append(ic, m.Name+"="+m.PeerURL)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
# Restore agents run beside the volumes, under their own ServiceAccount.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: etcdbackup-agent
  namespace: %[1]s
automountServiceAccountToken: false
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: etcdbackup-server
  namespace: %[1]s
rules:
  - apiGroups: [batch]
    resources: [jobs]
    verbs: [create, get, list, watch, delete, patch]
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [pods/log]
    verbs: [get]
  - apiGroups: [""]
    resources: [events]
    verbs: [list, watch]
  - apiGroups: [""]
    resources: [configmaps]
    resourceNames: [etcdbackup-agent-ca]
    verbs: [get, update]
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: etcdbackup-server
  namespace: %[1]s
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: etcdbackup-server
subjects:
  - kind: ServiceAccount
    name: etcdbackup-server
    namespace: %[2]s
`, ns, DefaultNamespace)
	for _, m := range members {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: %[2]s
  namespace: %[3]s
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: Service
metadata:
  name: %[1]s
  namespace: %[3]s
spec:
  selector:
    app: etcd
    member: %[1]s
  ports:
    - name: client
      port: 2379
      targetPort: client
    - name: peer
      port: 2380
      targetPort: peer
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: %[1]s
  namespace: %[3]s
spec:
  replicas: 1
  strategy:
    type: Recreate
  selector:
    matchLabels:
      app: etcd
      member: %[1]s
  template:
    metadata:
      labels:
        app: etcd
        member: %[1]s
    spec:
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        fsGroup: 65532
      containers:
        - name: etcd
          image: %[10]s
          imagePullPolicy: Never
          args:
            - --name=%[1]s
            - --data-dir=%[4]s/%[5]s
            - --listen-client-urls=http://0.0.0.0:2379
            - --advertise-client-urls=%[6]s
            - --listen-peer-urls=http://0.0.0.0:2380
            - --initial-advertise-peer-urls=%[7]s
            - --initial-cluster=%[8]s
            - --initial-cluster-token=%[9]s
            - --initial-cluster-state=new
          ports:
            - name: client
              containerPort: 2379
            - name: peer
              containerPort: 2380
          volumeMounts:
            - name: data
              mountPath: %[4]s
      volumes:
        - name: data
          persistentVolumeClaim:
            claimName: %[2]s
`, m.Name, m.ClaimName, ns, AppEtcdMountPath, m.DataDir, m.ClientURL, m.PeerURL, strings.Join(ic, ","), token, AppEtcdImage)
	}
	return b.String()
}

// AppEtcdClient is an etcd client to member (a Service in ns) through a
// port-forward to its pod, as kubectl port-forward would open.
func AppEtcdClient(cfg *rest.Config, ns, member string) (*clientv3.Client, error) {
	d, err := tunnel.New(cfg, tunnel.Target{Namespace: ns, Service: member, PortName: "client"})
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{"http://" + member + ":2379"},
		DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(d.DialContext)},
		Logger:      zap.NewNop(),
	})
}

// WaitEtcdHealthy waits until c's cluster has n started members and a
// quorum read works, and returns its member list.
func WaitEtcdHealthy(ctx context.Context, c *clientv3.Client, n int) (*clientv3.MemberListResponse, error) {
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ml, err := c.MemberList(rctx)
		if err == nil {
			started := 0
			for _, m := range ml.Members {
				if m.Name != "" {
					started++
				}
			}
			if started == n {
				_, err = c.Get(rctx, "health-probe")
				if err == nil {
					cancel()
					return ml, nil
				}
			} else {
				err = fmt.Errorf("%d of %d members started", started, n)
			}
		}
		cancel()
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("etcd cluster not healthy with %d members: %v", n, last)
		case <-time.After(time.Second):
		}
	}
}

// BreakGlassStorageConfig writes into dir what an operator copies out of
// the cluster for the day it is down, and returns its path: the server's
// configuration from its ConfigMap with only the S3 location, pointed at
// the store's address as this machine reaches it and at credential and CA
// files copied from the Secret and ConfigMap the server mounts.
func BreakGlassStorageConfig(ctx context.Context, k *Kubectl, product *Product, dir string) (string, error) {
	get := func(kind, name, path string) (string, error) {
		r := k.Run(ctx, "-n", DefaultNamespace, "get", kind, name, "-o", "jsonpath={"+path+"}")
		if r.ExitCode != 0 {
			return "", fmt.Errorf("get %s %s: %s", kind, name, r)
		}
		return r.Stdout, nil
	}
	cm, err := get("configmap", "etcdbackup-config", ".data.config\\.yaml")
	if err != nil {
		return "", err
	}
	var f config.File
	if err := yaml.UnmarshalStrict([]byte(cm), &f); err != nil {
		return "", fmt.Errorf("the server's configuration: %w", err)
	}
	var s3 *storage.LocationConfig
	for i := range f.Locations {
		if f.Locations[i].S3 != nil {
			s3 = &f.Locations[i]
		}
	}
	if s3 == nil {
		return "", fmt.Errorf("no S3 location in the server's configuration")
	}
	files := map[string]string{}
	for key, name := range map[string]string{"access-key-id": "id", "secret-access-key": "secret"} {
		v, err := get("secret", "s3-credentials", ".data."+key)
		if err != nil {
			return "", err
		}
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return "", fmt.Errorf("secret s3-credentials %s: %w", key, err)
		}
		files[name] = string(b)
	}
	if files["ca.crt"], err = get("configmap", "s3-ca", ".data.ca\\.crt"); err != nil {
		return "", err
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return "", err
		}
	}
	s3.S3.Endpoint = product.S3.Endpoint
	s3.S3.AccessKeyIDFile, s3.S3.SecretAccessKeyFile, s3.S3.CABundleFile = "id", "secret", "ca.crt"
	out, err := yaml.Marshal(config.File{Locations: []storage.LocationConfig{*s3}})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "storage.yaml")
	return path, os.WriteFile(path, out, 0o600)
}
