package world

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

// Product is the etcdbackup install in the sandbox, as a user would set it
// up on a kubeadm cluster with an S3-compatible store: the manifests, plus
// an overlay that names the cluster's own etcd as target `control-plane`
// (TLS client certificate from a Secret) and adds an `s3` location.
type Product struct {
	// S3 is the sandbox's S3 server (versitygw over HTTPS with its own CA).
	S3 *s3test.Server
	// Overlay is the kustomize directory that was applied.
	Overlay string
}

// Stop stops what the install started outside the cluster (the S3 server).
func (p *Product) Stop() {
	if p.S3 != nil {
		p.S3.Kill()
	}
}

// S3ServiceName is the Service pods reach the sandbox's S3 server by.
const S3ServiceName = "s3.kube-system.svc"

// InstallProduct starts the sandbox's S3 server, exposes it and the
// cluster's etcd as Services, writes a kustomize overlay over manifests/
// into dir/overlay and applies it with the real kubectl, then waits for the
// server Deployment to be Available.
func InstallProduct(ctx context.Context, sb *sandbox.Sandbox, k *Kubectl, images *Images, dir string, out io.Writer, extra ...PlainTarget) (*Product, error) {
	return InstallProductWith(ctx, sb, k, dir, out, ProductOptions{Images: images, PlainTargets: extra})
}

// ProductOptions adds targets to the installed configuration.
type ProductOptions struct {
	// Images are the product's images, imported into the node; the overlay
	// names them. Required.
	Images *Images
	// PlainTargets are test etcds on host addresses, exposed as Services.
	PlainTargets []PlainTarget
	// ClusterTargets are etcd clusters running as pods in the sandbox,
	// with their members' layout for in-cluster restores.
	ClusterTargets []ClusterTarget
	// Authorization is the server's authorization.mode ("" = default,
	// PortForward).
	Authorization string
	// HA installs the HA layout (manifests/components/ha): two replicas
	// electing the controller, the filesystem location on a shared claim.
	HA bool
	// Kit, when set, gives target control-plane a recovery kit, and
	// applies manifests/restore-namespace/, where its kit agents run.
	Kit *Kit
	// Vault adds location "vault": the S3 server's bucket with object
	// lock (s3test.LockedBucket), asking for COMPLIANCE for a day.
	Vault bool
	// CopyDefaultTo, when set, makes location default copy everything it
	// stores to the location of that name (copies: [{to: NAME}]).
	CopyDefaultTo string
	// AgentMemoryLimit, when set, is the agents' memory limit
	// (agents.resources; requests as the default's).
	AgentMemoryLimit string
}

// Kit is the control-plane target's recovery kit: the node's directories
// it holds, sealed to Recipients.
type Kit struct {
	NodeName   string
	Paths      []string
	Recipients []string
}

// vaultLines is location "vault" when asked for: the same store and
// credentials as location s3, on its bucket with object lock.
func vaultLines(vault bool, region string) string {
	if !vault {
		return ""
	}
	return fmt.Sprintf(`      - name: vault
        s3:
          bucket: %s
          prefix: sandbox
          region: %s
          endpoint: https://%s
          pathStyle: true
          caBundleFile: /etc/etcdbackup/s3-ca/ca.crt
          accessKeyIDFile: /etc/etcdbackup/s3-credentials/access-key-id
          secretAccessKeyFile: /etc/etcdbackup/s3-credentials/secret-access-key
          objectLock: {mode: COMPLIANCE, days: 1}
`, s3test.LockedBucket, region, S3ServiceName)
}

func copyLines(to string) string {
	if to == "" {
		return ""
	}
	return "        copies: [{to: " + to + "}]\n"
}

func kitLines(k *Kit) string {
	if k == nil {
		return ""
	}
	return fmt.Sprintf("        kit:\n          nodeName: %s\n          paths: [%s]\n          ageRecipients: [%s]\n",
		k.NodeName, strings.Join(k.Paths, ", "), strings.Join(k.Recipients, ", "))
}

// ClusterTarget is an etcd cluster running in the sandbox without TLS,
// configured with its members so `restore --target` can rebuild it.
type ClusterTarget struct {
	Name, Namespace, InitialClusterToken string
	// Location for its backups ("" = the server's default).
	Location string
	Members  []ClusterMember
	// AgeRecipients, when set, encrypt its backups (public keys only).
	AgeRecipients []string
	// DrillSchedule and DrillIdentitySecret, when set, are its
	// drill.schedule and drill.identitySecret.
	DrillSchedule, DrillIdentitySecret string
	// KeepLast, when set, is its retention.keepLast.
	KeepLast int
}

// ClusterMember is one member of a ClusterTarget: its data is DataDir in
// PersistentVolumeClaim ClaimName of the target's namespace.
type ClusterMember struct {
	Name, PeerURL, ClientURL, DataDir, ClaimName string
}

// InstallProductWith is InstallProduct with options.
func InstallProductWith(ctx context.Context, sb *sandbox.Sandbox, k *Kubectl, dir string, out io.Writer, opts ProductOptions) (*Product, error) {
	extra := opts.PlainTargets
	if opts.Images == nil {
		return nil, fmt.Errorf("install product: no images")
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	s3, err := StartS3(ctx, sb, filepath.Join(dir, "s3"))
	if err != nil {
		return nil, err
	}
	p := &Product{S3: s3}
	ok := false
	defer func() {
		if !ok {
			p.Stop()
		}
	}()
	if err := ExposeEtcd(ctx, sb); err != nil {
		return nil, err
	}

	for _, t := range extra {
		if err := sb.ExposeHostService(ctx, "kube-system", t.Name, 2379, t.Addr); err != nil {
			return nil, err
		}
	}
	p.Overlay = filepath.Join(dir, "overlay")
	if err := writeOverlay(p.Overlay, root, sb, s3, opts); err != nil {
		return nil, err
	}
	if opts.Kit != nil {
		// As docs/install.md says: the namespace kit agents run in.
		cmd := k.Command(ctx, "apply", "-k", filepath.Join(root, "manifests", "restore-namespace"))
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("kubectl apply -k manifests/restore-namespace: %w", err)
		}
	}
	cmd := k.Command(ctx, "apply", "-k", p.Overlay)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kubectl apply -k %s: %w", p.Overlay, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := sb.WaitForDeploymentAvailable(wctx, DefaultNamespace, "etcdbackup-server"); err != nil {
		return nil, err
	}
	// Agents reach the server by its Service.
	if err := sb.WaitForServiceRouted(wctx, DefaultNamespace, "etcdbackup"); err != nil {
		return nil, err
	}
	ok = true
	return p, nil
}

// StartS3 starts the sandbox's S3 server (versitygw over HTTPS with its
// own CA) with its data in dir, and exposes it to pods as S3ServiceName
// (port 443). The caller kills it.
func StartS3(ctx context.Context, sb *sandbox.Sandbox, dir string) (*s3test.Server, error) {
	bin, err := s3test.FindBinary()
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s3, err := s3test.New(dir, bin, S3ServiceName)
	if err != nil {
		return nil, fmt.Errorf("s3 server: %w", err)
	}
	if err := s3.Restart(); err != nil {
		return nil, fmt.Errorf("s3 server: %w", err)
	}
	if err := sb.ExposeHostService(ctx, "kube-system", "s3", 443, s3.Addr()); err != nil {
		s3.Kill()
		return nil, err
	}
	return s3, nil
}

// EtcdServiceURL is the client URL pods reach the sandbox's own etcd by
// (ExposeEtcd): the stand-in for a kubeadm control-plane node's IP.
const EtcdServiceURL = "https://etcd.kube-system.svc:2379"

// ExposeEtcd exposes the sandbox cluster's etcd to pods as EtcdServiceURL.
func ExposeEtcd(ctx context.Context, sb *sandbox.Sandbox) error {
	// The cluster's etcd listens on the host end of the node's veth too.
	_, etcdPort, err := net.SplitHostPort(strings.TrimPrefix(sb.EtcdEndpoint(), "https://"))
	if err != nil {
		return fmt.Errorf("etcd endpoint %s: %w", sb.EtcdEndpoint(), err)
	}
	return sb.ExposeHostService(ctx, "kube-system", "etcd", 2379, net.JoinHostPort(sandbox.HostIP, etcdPort))
}

// PlainTarget is an extra etcd target without TLS (a test's own etcd on a
// host address), exposed to pods as NAME.kube-system.svc:2379.
type PlainTarget struct {
	Name string
	Addr string
	// Schedule, when set, is the target's cron schedule.
	Schedule string
	// KeepLast, when set, is its retention.keepLast.
	KeepLast int
	// Drill, when set, is its drill.schedule.
	Drill string
	// DeltaPeriod, when set, is its deltas.period: the server keeps a
	// delta agent capturing it.
	DeltaPeriod string
	// CompactAfterRevisions, when set, is its deltas.compactAfterRevisions.
	CompactAfterRevisions int64
	// TLS, when set, is the client certificate the target's etcd asks
	// for (https, client-certificate authentication, as kubeadm runs
	// it), installed as Secret NAME-etcd-client; its server certificate
	// must name NAME.kube-system.svc.
	TLS *TargetTLS
}

// TargetTLS are PEM files: the CA of the target's etcd, a client
// certificate it trusts and its key.
type TargetTLS struct {
	CAFile, CertFile, KeyFile string
}

func writeOverlay(dir, root string, sb *sandbox.Sandbox, s3 *s3test.Server, opts ProductOptions) error {
	images, extra, cluster := opts.Images, opts.PlainTargets, opts.ClusterTargets
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	base, err := filepath.Rel(dir, filepath.Join(root, "manifests"))
	if err != nil {
		return err
	}
	ca, cert, key := sb.EtcdClientTLS()
	copies := map[string]string{
		"etcd-ca.crt": ca, "etcd-tls.crt": cert, "etcd-tls.key": key,
		"s3-access-key-id": s3.AccessKeyIDFile, "s3-secret-access-key": s3.SecretAccessKeyFile, "s3-ca.crt": s3.CAFile,
	}
	var targetSecrets strings.Builder
	for _, t := range extra {
		if t.TLS == nil {
			continue
		}
		copies[t.Name+"-ca.crt"], copies[t.Name+"-tls.crt"], copies[t.Name+"-tls.key"] = t.TLS.CAFile, t.TLS.CertFile, t.TLS.KeyFile
		fmt.Fprintf(&targetSecrets, "  - name: %[1]s-etcd-client\n    files: [ca.crt=%[1]s-ca.crt, tls.crt=%[1]s-tls.crt, tls.key=%[1]s-tls.key]\n", t.Name)
	}
	for name, src := range copies {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	// The overlay's config.yaml replaces the HA component's whole: it
	// says again what that one does (replicas, the shared claim).
	components, replicas, shared := "", "", ""
	if opts.HA {
		ha, err := filepath.Rel(dir, filepath.Join(root, "manifests", "components", "ha"))
		if err != nil {
			return err
		}
		components = "components:\n  - " + ha + "\n"
		replicas = "    replicas: 2\n"
		shared = "          sharedVolume: true\n"
	}
	serverName, serverTag := nameAndTag(images.Server)
	agentName, agentTag := nameAndTag(images.Agent)
	files := map[string]string{
		"kustomization.yaml": fmt.Sprintf(`# The sandbox's install: the project's manifests as a user applies them,
# with the cluster's etcd as a backup target and an S3 location.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %[1]s
resources:
  - %[2]s
generatorOptions:
  disableNameSuffixHash: true
secretGenerator:
  # What a kubeadm operator copies from /etc/kubernetes/pki/etcd.
  - name: etcd-client
    files: [ca.crt=etcd-ca.crt, tls.crt=etcd-tls.crt, tls.key=etcd-tls.key]
  - name: s3-credentials
    files: [access-key-id=s3-access-key-id, secret-access-key=s3-secret-access-key]
%[9]sconfigMapGenerator:
  - name: s3-ca
    files: [ca.crt=s3-ca.crt]
images:
  # The images built from this repository, imported into the node.
  - name: etcdbackup-server
    newName: %[3]s
    newTag: %[4]q # quoted: a tag such as a commit hash can be all digits
  # The agent image: the server's init container, which the server reads.
  - name: etcdbackup-agent
    newName: %[5]s
    newTag: %[6]q
%[8]spatches:
  - path: config.yaml
  - path: deployment.yaml
%[7]s%[10]s`, DefaultNamespace, base, serverName, serverTag, agentName, agentTag, restoreNamespacesPatch(cluster), components, targetSecrets.String(), targetSecretsRolePatch(extra)),
		"config.yaml": fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: etcdbackup-config
data:
  config.yaml: |
%[7]s    locations:
      - name: default
        filesystem:
          path: /var/lib/etcdbackup
%[8]s      - name: s3
        s3:
          bucket: %[1]s
          prefix: sandbox
          region: %[2]s
          endpoint: https://%[3]s
          pathStyle: true
          caBundleFile: /etc/etcdbackup/s3-ca/ca.crt
          accessKeyIDFile: /etc/etcdbackup/s3-credentials/access-key-id
          secretAccessKeyFile: /etc/etcdbackup/s3-credentials/secret-access-key
%[10]s    targets:
      - name: control-plane
        endpoints: [%[6]s]
        tlsSecret: etcd-client
%[9]s%[4]s    agents:
      serviceAccount: etcdbackup-agent
%[11]s%[5]s`, s3.Bucket, s3.Region, S3ServiceName, plainTargets(extra)+clusterTargets(cluster), authorization(opts.Authorization), EtcdServiceURL, replicas, shared+copyLines(opts.CopyDefaultTo), kitLines(opts.Kit), vaultLines(opts.Vault, s3.Region), agentResources(opts.AgentMemoryLimit)),
		"deployment.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: etcdbackup-server
spec:
  template:
    spec:
      containers:
        - name: server
          volumeMounts:
            - name: s3-credentials
              mountPath: /etc/etcdbackup/s3-credentials
              readOnly: true
            - name: s3-ca
              mountPath: /etc/etcdbackup/s3-ca
              readOnly: true
      volumes:
        - name: s3-credentials
          secret:
            secretName: s3-credentials
            defaultMode: 0440
        - name: s3-ca
          configMap:
            name: s3-ca
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// agentResources are the agents: lines of a memory limit other than the
// default's.
func agentResources(limit string) string {
	if limit == "" {
		return ""
	}
	return fmt.Sprintf(`      resources:
        requests: {cpu: 100m, memory: 128Mi}
        limits: {memory: %s}
`, limit)
}

func authorization(mode string) string {
	if mode == "" {
		return ""
	}
	return "    authorization:\n      mode: " + mode + "\n"
}

// restoreNamespacesPatch lets the restore agents of cluster targets reach
// the agent port, as docs/security.md tells users to do: one more
// NetworkPolicy peer per target namespace.
func restoreNamespacesPatch(ts []ClusterTarget) string {
	var b strings.Builder
	seen := map[string]bool{}
	for _, t := range ts {
		if seen[t.Namespace] || t.Namespace == "" || t.Namespace == DefaultNamespace {
			continue
		}
		seen[t.Namespace] = true
		fmt.Fprintf(&b, `      - op: add
        path: /spec/ingress/0/from/-
        value:
          namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
          podSelector: {matchLabels: {app.kubernetes.io/managed-by: etcdbackup-server, app.kubernetes.io/component: restore-agent}}
`, t.Namespace)
	}
	if b.Len() == 0 {
		return ""
	}
	return "  - target: {kind: NetworkPolicy, name: etcdbackup-server}\n    patch: |-\n" + b.String()
}

// targetSecretsRolePatch lets the server check the TLS Secrets of extra
// targets, as the server's Role tells users to do: their names beside
// etcd-client (the test fails the patch if that rule moved).
func targetSecretsRolePatch(ts []PlainTarget) string {
	var b strings.Builder
	for _, t := range ts {
		if t.TLS != nil {
			fmt.Fprintf(&b, "      - op: add\n        path: /rules/4/resourceNames/-\n        value: %s-etcd-client\n", t.Name)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "  - target: {kind: Role, name: etcdbackup-server}\n    patch: |-\n      - op: test\n        path: /rules/4/resourceNames/0\n        value: etcd-client\n" + b.String()
}

func plainTargets(ts []PlainTarget) string {
	var b strings.Builder
	for _, t := range ts {
		if t.TLS != nil {
			fmt.Fprintf(&b, "      - name: %[1]s\n        endpoints: [https://%[1]s.kube-system.svc:2379]\n        tlsSecret: %[1]s-etcd-client\n", t.Name)
		} else {
			fmt.Fprintf(&b, "      - name: %s\n        endpoints: [http://%s.kube-system.svc:2379]\n        insecurePlaintext: true\n", t.Name, t.Name)
		}
		if t.Schedule != "" {
			fmt.Fprintf(&b, "        schedule: %q\n", t.Schedule)
		}
		if t.KeepLast > 0 {
			fmt.Fprintf(&b, "        retention: {keepLast: %d}\n", t.KeepLast)
		}
		if t.Drill != "" {
			fmt.Fprintf(&b, "        drill: {schedule: %q}\n", t.Drill)
		}
		if t.DeltaPeriod != "" {
			fmt.Fprintf(&b, "        deltas: {period: %q, compactAfterRevisions: %d}\n", t.DeltaPeriod, t.CompactAfterRevisions)
		}
	}
	return b.String()
}

func clusterTargets(ts []ClusterTarget) string {
	var b strings.Builder
	for _, t := range ts {
		var eps []string
		for _, m := range t.Members {
			eps = append(eps, m.ClientURL)
		}
		fmt.Fprintf(&b, "      - name: %s\n        endpoints: [%s]\n        insecurePlaintext: true\n", t.Name, strings.Join(eps, ", "))
		if t.Location != "" {
			fmt.Fprintf(&b, "        location: %s\n", t.Location)
		}
		if len(t.AgeRecipients) > 0 {
			fmt.Fprintf(&b, "        encryption: {ageRecipients: [%s]}\n", strings.Join(t.AgeRecipients, ", "))
		}
		if t.DrillSchedule != "" {
			fmt.Fprintf(&b, "        drill: {schedule: %q, identitySecret: %q}\n", t.DrillSchedule, t.DrillIdentitySecret)
		}
		if t.KeepLast > 0 {
			fmt.Fprintf(&b, "        retention: {keepLast: %d}\n", t.KeepLast)
		}
		fmt.Fprintf(&b, "        namespace: %s\n        initialClusterToken: %s\n        members:\n", t.Namespace, t.InitialClusterToken)
		for _, m := range t.Members {
			fmt.Fprintf(&b, "          - name: %s\n            peerURL: %s\n            clientURL: %s\n            dataDir: %q\n            volume: {persistentVolumeClaim: {claimName: %s}}\n",
				m.Name, m.PeerURL, m.ClientURL, m.DataDir, m.ClaimName)
		}
	}
	return b.String()
}
