package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// TestSecurity installs the product in strict mode (authorization.mode
// SubjectAccessReview) and attacks it as docs/security.md's threat model
// says: a pod in another namespace, a copy of an agent pod, users whose
// role does not allow a verb, and tokens that must not count.
func TestSecurity(t *testing.T) {
	sb, im := startSandboxEnforcing(t)
	admin := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: admin}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := world.DefaultNamespace

	ms := newMembers(t, 1)
	startMembers(t, ms)
	product, err := world.InstallProductWith(ctx, sb, admin, t.TempDir(), &testLog{t: t, prefix: "install: "}, world.ProductOptions{
		Images:        im,
		PlainTargets:  []world.PlainTarget{{Name: "plain", Addr: ms[0].clientURL.Host}},
		Authorization: config.AuthorizationSubjectAccessReview,
		Vault:         true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)

	// Users: ServiceAccounts of a team namespace, bound in the server's
	// namespace to the shipped ClusterRoles, as docs/security.md says.
	const team = "team"
	if err := sb.EnsureNamespace(ctx, team); err != nil {
		t.Fatal(err)
	}
	as := map[string]*world.Kubectl{}
	tokens := map[string]string{}
	for _, role := range []string{"viewer", "operator", "admin"} {
		tokens[role] = userToken(ctx, t, sb, team, role, tokenOptions{})
		as[role] = tokenKubectl(t, sb, tokens[role])
	}
	run := func(k *world.Kubectl, args ...string) world.Result {
		t.Helper()
		return k.Run(ctx, append([]string{"etcdbackup"}, args...)...)
	}

	t.Run("operator-backs-up", func(t *testing.T) {
		r := mustSucceed(t, run(as["operator"], "backup", "--target", "plain", "--name", "real-1", "--wait"), "operator: backup --wait")
		if !strings.Contains(r.Stdout, "Completed") {
			t.Fatalf("backup --wait: %s", r)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("no-snapshot-bytes-on-the-pod-network", func(t *testing.T) {
		noSnapshotBytesOnThePodNetwork(ctx, t, sb, ms, func() {
			mustSucceed(t, run(as["operator"], "backup", "--target", "plain", "--name", "sniffed", "--wait"), "operator: backup --wait")
		})
	})

	t.Run("viewer", func(t *testing.T) {
		v := as["viewer"]
		if r := mustSucceed(t, run(v, "list"), "viewer: list"); !strings.Contains(r.Stdout, "real-1") {
			t.Fatalf("viewer's list lacks real-1: %s", r)
		}
		mustSucceed(t, run(v, "get", "real-1"), "viewer: get")
		out := filepath.Join(t.TempDir(), "real-1.db")
		mustSucceed(t, run(v, "download", "real-1", "-o", out), "viewer: download")
		if fi, err := os.Stat(out); err != nil || fi.Size() == 0 {
			t.Fatalf("viewer's download: %v", err)
		}
		for _, tc := range []struct {
			args           []string
			verb, resource string
		}{
			{[]string{"delete", "real-1"}, "delete", "backups.etcdbackup.io"},
			{[]string{"backup", "--target", "plain", "--name", "by-viewer"}, "create", "backups.etcdbackup.io"},
			{[]string{"upload", out, "--name", "by-viewer"}, "upload", "backups.etcdbackup.io"},
			{[]string{"restore", "real-1", "--target", "plain"}, "create", "restores.etcdbackup.io"},
		} {
			r := mustFail(t, run(v, tc.args...), "viewer: "+strings.Join(tc.args, " "))
			for _, want := range []string{"system:serviceaccount:team:viewer", tc.verb, tc.resource, "kubectl auth can-i " + tc.verb} {
				if !strings.Contains(r.Stderr, want) {
					t.Errorf("viewer's %s: refusal does not say %q: %s", tc.args[0], want, r.Stderr)
				}
			}
		}
		if r := mustSucceed(t, run(as["admin"], "list"), "admin: list"); !strings.Contains(r.Stdout, "real-1") || strings.Contains(r.Stdout, "by-viewer") {
			t.Fatalf("after the viewer's refused calls: %s", r)
		}
	})

	// The attacker with the storage credentials (read from the server's
	// Secret by cluster-admin) meets the store's object lock: a backup an
	// agent in the cluster stored in location vault survives the
	// product's delete and prune, and a raw DeleteObject of its bytes
	// with the server's own credentials. The ledger names who stored and
	// read it by their Kubernetes identity; a viewer may not read it.
	t.Run("locked-backup-survives-its-credentials", func(t *testing.T) {
		admin := as["admin"]
		mustSucceed(t, run(admin, "backup", "--target", "plain", "--location", "vault", "--name", "locked-1", "--wait"), "admin: backup into vault")
		r := mustSucceed(t, run(admin, "get", "locked-1", "--location", "vault", "-o", "jsonpath={.status.lockedUntil}"), "admin: get")
		until, err := time.Parse(time.RFC3339, strings.TrimSpace(r.Stdout))
		if err != nil || time.Until(until) < 23*time.Hour {
			t.Fatalf("locked-1 is locked until %q, want a day from now", r.Stdout)
		}
		r = mustFail(t, run(admin, "delete", "locked-1", "--location", "vault", "--yes"), "admin: delete a locked backup")
		if !strings.Contains(r.Stderr, "is locked until "+until.UTC().Format(time.RFC3339)) || !strings.Contains(r.Stderr, "nothing of it was deleted") {
			t.Errorf("delete of a locked backup: %s", r)
		}
		mustSucceed(t, run(admin, "download", "locked-1", "--location", "vault", "-o", filepath.Join(t.TempDir(), "locked-1.db")), "admin: download")

		// The server's own credentials, straight at the store.
		s3 := product.S3.Client()
		key := "sandbox/backups/locked-1.db"
		versions, err := s3.ListObjectVersions(ctx, &s3sdk.ListObjectVersionsInput{Bucket: aws.String(s3test.LockedBucket), Prefix: aws.String(key)})
		if err != nil || len(versions.Versions) != 1 {
			t.Fatalf("versions of %s: %v %+v", key, err, versions)
		}
		if _, err := s3.DeleteObject(ctx, &s3sdk.DeleteObjectInput{Bucket: aws.String(s3test.LockedBucket), Key: aws.String(key), VersionId: versions.Versions[0].VersionId}); err == nil {
			t.Fatal("the store deleted a locked backup's bytes for the server's credentials")
		}
		mustSucceed(t, run(admin, "verify", "locked-1", "--location", "vault"), "admin: verify after the raw delete")

		r = mustSucceed(t, run(admin, "audit", "--location", "vault", "--backup", "locked-1"), "admin: audit")
		for _, want := range []string{"upload", "backup agent of job", "download", "user system:serviceaccount:team:admin"} {
			if !strings.Contains(r.Stdout, want) {
				t.Errorf("audit does not say %q:\n%s", want, r.Stdout)
			}
		}
		mustSucceed(t, run(admin, "audit", "--verify"), "admin: audit --verify")
		r = mustFail(t, run(as["viewer"], "audit"), "viewer: audit")
		if !strings.Contains(r.Stderr, "audit") || !strings.Contains(r.Stderr, "backups.etcdbackup.io") {
			t.Errorf("viewer's audit: refusal does not name the verb: %s", r.Stderr)
		}
	})

	t.Run("tokens-that-do-not-count", func(t *testing.T) {
		// The admin's kubeconfig authenticates with a client certificate:
		// nothing the server could review.
		r := mustFail(t, run(admin, "list"), "client-certificate user in strict mode")
		if !strings.Contains(r.Stderr, "token") || !strings.Contains(r.Stderr, "kubectl create token") {
			t.Errorf("a client-certificate user is not told how to use a token: %s", r.Stderr)
		}
		// The others reach the server through the admin's port-forward, with
		// the token in the call: the API server would refuse them before,
		// the server must refuse them too.
		refused := func(token, what string) {
			t.Helper()
			r := mustFail(t, run(admin, "list", "--token", token), what)
			if !strings.Contains(r.Stderr, "did not accept the bearer token") {
				t.Errorf("%s: refusal does not say the token was not accepted: %s", what, r.Stderr)
			}
		}
		refused(userToken(ctx, t, sb, team, "admin", tokenOptions{Audiences: []string{"some-other-audience"}}), "token for another audience")

		expired, err := sb.ResignServiceAccountToken(tokens["admin"], func(c map[string]any) {
			past := time.Now().Add(-2 * time.Hour).Unix()
			c["iat"], c["nbf"], c["exp"] = past-600, past-600, past
		})
		if err != nil {
			t.Fatal(err)
		}
		refused(expired, "expired token")

		// A token bound to a pod dies with the pod.
		pod := sleeperPod(ctx, t, sb, team, "admin")
		bound := userToken(ctx, t, sb, team, "admin", tokenOptions{BoundPod: pod.Name})
		mustSucceed(t, run(tokenKubectl(t, sb, bound), "list"), "token bound to a live pod")
		if err := sb.Client().CoreV1().Pods(team).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		pollUntil(ctx, t, "the bound pod gone", func() bool {
			_, err := sb.Client().CoreV1().Pods(team).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		// The API server caches a token's success for up to 10 s
		// (kube-apiserver's token cache), so the refusal may take that
		// long to start.
		deadline := time.Now().Add(30 * time.Second)
		for run(admin, "list", "--token", bound).ExitCode == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Second)
		}
		refused(bound, "token bound to a deleted pod")
	})

	t.Run("pod-in-another-namespace", func(t *testing.T) {
		const intruder = "intruder"
		if err := sb.EnsureNamespace(ctx, intruder); err != nil {
			t.Fatal(err)
		}
		server := installedServerPod(ctx, t, sb, ns)
		svc := "etcdbackup." + ns + ".svc:50052"
		attempts := [][]string{
			{"list", "--server-address", svc},
			{"download", "real-1", "-o", "-", "--server-address", svc},
			{"delete", "real-1", "--server-address", svc},
			{"backup", "--target", "plain", "--name", "stolen", "--server-address", svc},
			// The user API is not on the pod IP at all.
			{"list", "--server-address", server.Status.PodIP + ":50051"},
		}
		check := func(t *testing.T, phase string, want func(name, logs string) error) {
			// All at once: a dropped connection waits out --connect-timeout.
			for i, args := range attempts {
				startCLIPod(ctx, t, sb, im.CLI, intruder, fmt.Sprintf("cli-%s-%d", phase, i), args...)
			}
			for i, args := range attempts {
				ended, logs := waitPodDone(ctx, t, sb, intruder, fmt.Sprintf("cli-%s-%d", phase, i))
				if ended == corev1.PodSucceeded {
					t.Errorf("%s succeeded from another namespace: %s", strings.Join(args, " "), logs)
					continue
				}
				if err := want(strings.Join(args, " "), logs); err != nil {
					t.Error(err)
				}
			}
		}
		// With the shipped NetworkPolicy removed, the server itself refuses
		// every call: no token, no entry.
		mustSucceed(t, c.run(t, nil, "-n", ns, "delete", "networkpolicy", "etcdbackup-server"), "delete the NetworkPolicy")
		check(t, "nopolicy", func(args, logs string) error {
			if strings.Contains(args, ":50051") {
				if !strings.Contains(logs, "connection refused") {
					return fmt.Errorf("%s: want connection refused: %s", args, logs)
				}
				return nil
			}
			// The agent port speaks TLS: a plaintext client does not get as
			// far as a call (and one that skipped verifying the server
			// would meet the token checks).
			for _, refusal := range []string{"bearer token", "the agent port serves only", "server preface", "connection closed", "EOF"} {
				if strings.Contains(logs, refusal) {
					return nil
				}
			}
			return fmt.Errorf("%s: neither refused by the agent port's TLS nor by the server's token checks: %s", args, logs)
		})
		mustSucceed(t, c.run(t, nil, "apply", "-k", product.Overlay), "re-apply the install")
		if sb.EnforcesNetworkPolicy() {
			// And with it, nothing from here reaches the pod at all.
			check(t, "policy", func(args, logs string) error {
				if strings.Contains(logs, "bearer token") || strings.Contains(logs, "the agent port serves only") {
					return fmt.Errorf("%s reached the server through the NetworkPolicy: %s", args, logs)
				}
				return nil
			})
		}
		if r := mustSucceed(t, run(as["admin"], "list"), "admin: list"); !strings.Contains(r.Stdout, "real-1") || strings.Contains(r.Stdout, "stolen") {
			t.Fatalf("after the intruder's calls: %s", r)
		}
	})

	t.Run("copy-of-an-agent-pod", func(t *testing.T) {
		jobs, err := sb.Client().BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=backup-agent"})
		if err != nil {
			t.Fatal(err)
		}
		var real *batchv1.Job
		for i := range jobs.Items {
			if jobs.Items[i].Annotations["etcdbackup.io/backup"] == "real-1" {
				real = &jobs.Items[i]
			}
		}
		if real == nil || real.Status.Succeeded != 1 {
			t.Fatalf("the real agent Job of real-1: %+v", real)
		}
		// Same ServiceAccount, same Secrets, same labels (so the
		// NetworkPolicy lets it in), same projected token: only the name
		// it stores under differs, and it is not the Job's pod.
		spec := real.Spec.Template.Spec.DeepCopy()
		for i, a := range spec.Containers[0].Args {
			if strings.HasPrefix(a, "--name=") {
				spec.Containers[0].Args[i] = "--name=forged"
			}
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "forged-agent", Namespace: ns, Labels: real.Spec.Template.Labels},
			Spec:       *spec,
		}
		if _, err := sb.Client().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		phase, logs := waitPodDone(ctx, t, sb, ns, pod.Name)
		if phase != corev1.PodFailed {
			t.Fatalf("the forged agent pod ended %s: %s", phase, logs)
		}
		if !strings.Contains(logs, "PermissionDenied") && !strings.Contains(logs, "permission") {
			t.Errorf("the forged agent's refusal does not say it was denied: %s", logs)
		}
		t.Logf("forged agent: %s", lastLines(logs, 3))
		if r := mustSucceed(t, run(as["admin"], "list"), "admin: list"); strings.Contains(r.Stdout, "forged") {
			t.Fatalf("the forged agent stored a backup: %s", r)
		}
	})

	// A Job that carries every label and annotation of a real agent Job
	// of the server (its signature too), made by someone who may create
	// Jobs where restores of a target run, and pinned to the real
	// backup's SHA-256: everything the guard once trusted. The sandbox's
	// target has no members to restore, so the copy is of the real backup
	// Job, turned into a restore Job; the unit tests (server/auth) copy a
	// real restore Job.
	t.Run("copy-of-an-agent-job", func(t *testing.T) {
		list, err := sb.Client().BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=backup-agent"})
		if err != nil {
			t.Fatal(err)
		}
		var real *batchv1.Job
		for i := range list.Items {
			if list.Items[i].Annotations["etcdbackup.io/backup"] == "real-1" {
				real = &list.Items[i]
			}
		}
		if real == nil || real.Annotations["etcdbackup.io/signature"] == "" {
			t.Fatalf("the real, signed agent Job of real-1: %+v", real)
		}
		got := mustSucceed(t, run(as["admin"], "get", "real-1", "-o", "json"), "admin: get real-1")
		m := regexp.MustCompile(`"sha256":\s*"([0-9a-f]{64})"`).FindStringSubmatch(got.Stdout)
		if m == nil {
			t.Fatalf("no SHA-256 in get -o json: %s", got.Stdout)
		}
		labels := maps.Clone(real.Labels)
		labels["app.kubernetes.io/component"] = "restore-agent"
		delete(labels, "etcdbackup.io/scheduled")
		annotations := maps.Clone(real.Annotations)
		annotations["etcdbackup.io/sha256"] = m[1]
		delete(annotations, "etcdbackup.io/counted")
		spec := real.Spec.DeepCopy()
		spec.Selector, spec.ManualSelector, spec.Suspend = nil, nil, nil
		tmpl := &spec.Template
		tmpl.Labels = map[string]string{"app.kubernetes.io/managed-by": "etcdbackup-server", "app.kubernetes.io/component": "restore-agent"}
		// How the real agent reaches the server (address, token, the
		// server's CA and name for TLS): the copy uses the same.
		var reach []string
		for _, a := range tmpl.Spec.Containers[0].Args {
			for _, flag := range []string{"--server=", "--token-file=", "--server-ca=", "--server-name="} {
				if strings.HasPrefix(a, flag) {
					reach = append(reach, a)
				}
			}
		}
		tmpl.Spec.Containers[0].Args = append(append([]string{"restore"}, reach...),
			"--name=real-1", "--location="+real.Annotations["etcdbackup.io/location"], "--sha256="+m[1],
			"--data-dir=/var/lib/etcdbackup-work/data", "--work-dir=/var/lib/etcdbackup-work/download",
			"--member-name=m0", "--initial-cluster=m0=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380")
		forged := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "restore-forged", Namespace: ns, Labels: labels, Annotations: annotations}, Spec: *spec}
		if _, err := sb.Client().BatchV1().Jobs(ns).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods, err := waitJobPod(ctx, sb, ns, forged.Name)
		if err != nil {
			t.Fatal(err)
		}
		phase, logs := waitPodDone(ctx, t, sb, ns, pods)
		if phase != corev1.PodFailed {
			t.Fatalf("the forged restore Job's pod ended %s: %s", phase, logs)
		}
		if !strings.Contains(logs, "is not one the server created") {
			t.Errorf("the forged restore's download was not refused as a Job the server did not create: %s", lastLines(logs, 5))
		}
		if strings.Contains(logs, m[1]) {
			t.Errorf("the agent logged the backup's SHA-256: %s", logs)
		}
	})

	t.Run("upload-with-the-servers-labels", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "fake.db")
		if err := os.WriteFile(file, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(as["operator"], "upload", file, "--name", "cp-20991231-000000", "--labels", "etcdbackup.io/scheduled=true,etcdbackup.io/target=plain")
		if r.ExitCode == 0 || !strings.Contains(r.Stderr, `--labels: "etcdbackup.io/scheduled"`) {
			t.Fatalf("upload with etcdbackup.io labels: %s; want refused naming the flag", r)
		}
		// Past the plugin: the same upload as raw gRPC with the operator's
		// token, through a port-forward to the server's user API. The
		// server refuses the labels itself, before it stores a byte.
		tokenFile := filepath.Join(t.TempDir(), "operator-token")
		if err := os.WriteFile(tokenFile, []byte(tokens["operator"]), 0o600); err != nil {
			t.Fatal(err)
		}
		conn, cl, err := client.Dial(portForward(ctx, t, admin, ns, "deployment/etcdbackup-server", userPort), client.WithTokenFile(tokenFile))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = cl.Upload(ctx, bytes.NewReader(etcdtest.TrailedBytes(t, etcdtest.TrailedSize(4096))), &ebv1.UploadHeader{
			Name: "cp-20991231-000000", Labels: map[string]string{"etcdbackup.io/scheduled": "true", "etcdbackup.io/target": "plain"}}, nil)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "etcdbackup.io/") {
			t.Errorf("raw gRPC upload with the server's labels: %v; want InvalidArgument naming the label", err)
		}
		if r := mustSucceed(t, run(as["admin"], "list"), "admin: list"); strings.Contains(r.Stdout, "cp-20991231-000000") {
			t.Fatalf("the upload was stored: %s", r)
		}
	})

	t.Run("keys-removed-by-a-restore-are-made-anew", func(t *testing.T) {
		// A restore of the cluster the server runs in removes its key
		// Secrets (snapshot.RevokeServerKeys: every backup holds them).
		// The running server makes new ones, serves a certificate of the
		// new CA, publishes it, and signs new Jobs with the new key: a
		// backup after that works end to end.
		secrets, cms := sb.Client().CoreV1().Secrets(ns), sb.Client().CoreV1().ConfigMaps(ns)
		data := func(name, key string) string {
			s, err := secrets.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return ""
			}
			return string(s.Data[key])
		}
		oldKey, oldCA := data("etcdbackup-job-signing-key", "key"), data("etcdbackup-agent-ca", "ca.crt")
		if oldKey == "" || oldCA == "" {
			t.Fatalf("the server's key Secrets before: key %d bytes, CA %d bytes", len(oldKey), len(oldCA))
		}
		for _, name := range snapshot.ServerKeySecrets {
			if err := secrets.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pollUntil(ctx, t, "new key Secrets, and the new CA published", func() bool {
			key, ca := data("etcdbackup-job-signing-key", "key"), data("etcdbackup-agent-ca", "ca.crt")
			cm, err := cms.Get(ctx, "etcdbackup-agent-ca", metav1.GetOptions{})
			return key != "" && key != oldKey && ca != "" && ca != oldCA && err == nil && cm.Data["ca.crt"] == ca
		})
		r := mustSucceed(t, run(as["operator"], "backup", "--target", "plain", "--name", "after-new-keys", "--wait"), "operator: backup --wait after the keys were made anew")
		if !strings.Contains(r.Stdout, "Completed") {
			t.Fatalf("backup --wait: %s", r)
		}
	})

	// Last: it leaves the server with an agent image no node can pull.
	t.Run("agent-image-not-mirrored", func(t *testing.T) {
		// The most common mistake of an air-gapped install: the agent
		// image is not in a registry the nodes reach. `backup --wait`
		// fails within a minute or so, naming the image and what to do,
		// instead of waiting for the Job's deadline (issue 38).
		const image = "registry.invalid/etcdbackup-agent:not-mirrored"
		cms := sb.Client().CoreV1().ConfigMaps(ns)
		cm, err := cms.Get(ctx, "etcdbackup-config", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		const sa = "\n  serviceAccount: etcdbackup-agent\n"
		if !strings.Contains(cm.Data["config.yaml"], sa) {
			t.Fatalf("the installed config has no agents.serviceAccount line to add the image beside:\n%s", cm.Data["config.yaml"])
		}
		cm.Data["config.yaml"] = strings.Replace(cm.Data["config.yaml"], sa, sa+"  image: "+image+"\n", 1)
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		mustSucceed(t, c.run(t, nil, "-n", ns, "rollout", "restart", "deployment/etcdbackup-server"), "rollout restart")
		mustSucceed(t, c.run(t, nil, "-n", ns, "rollout", "status", "deployment/etcdbackup-server", "--timeout=110s"), "rollout status")
		start := time.Now()
		r := run(as["operator"], "backup", "--target", "plain", "--name", "not-mirrored", "--wait")
		took := time.Since(start)
		t.Logf("backup --wait with an image no node can pull: exit %d after %s: %s", r.ExitCode, took.Round(time.Second), strings.TrimSpace(r.Stderr))
		if r.ExitCode == 0 || !strings.Contains(r.Stderr, image) || !strings.Contains(r.Stderr, "cannot be pulled") || !strings.Contains(r.Stderr, "again") {
			t.Fatalf("backup --wait with an unpullable agent image: %s; want a failure naming %s and what to do", r, image)
		}
		if took > 100*time.Second {
			t.Errorf("backup --wait took %s to fail; want about a minute", took.Round(time.Second))
		}
	})
}

type tokenOptions struct {
	// BoundPod binds the token to that pod of the ServiceAccount.
	BoundPod string
	// Audiences the token is for; none means the API server's.
	Audiences []string
}

// userToken returns a token of ServiceAccount sa in ns, created if missing
// and bound with a RoleBinding in the server's namespace to the shipped
// ClusterRole etcdbackup-SA.
func userToken(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns, sa string, opts tokenOptions) string {
	t.Helper()
	cs := sb.Client()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := "etcdbackup-" + sa
	_, err := cs.RbacV1().RoleBindings(world.DefaultNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: opts.Audiences, ExpirationSeconds: ptr.To[int64](3600)}}
	if opts.BoundPod != "" {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, opts.BoundPod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// tokenKubectl is kubectl with a kubeconfig whose user is only token.
func tokenKubectl(t *testing.T, sb *sandbox.Sandbox, token string) *world.Kubectl {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(sb.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for name := range cfg.AuthInfos {
		cfg.AuthInfos[name].ClientCertificateData = nil
		cfg.AuthInfos[name].ClientKeyData = nil
		cfg.AuthInfos[name].ClientCertificate = ""
		cfg.AuthInfos[name].ClientKey = ""
		cfg.AuthInfos[name].Token = token
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: path, PluginDir: binDir}
}

// sleeperPod runs the pause image as ServiceAccount sa.
func sleeperPod(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns, sa string) *corev1.Pod {
	t.Helper()
	pod, err := sb.Client().CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper-" + sa},
		Spec: corev1.PodSpec{
			ServiceAccountName:           sa,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "pause", Image: sb.PauseImage(), ImagePullPolicy: corev1.PullNever}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// startCLIPod starts the CLI image with args as a pod in ns.
func startCLIPod(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, image, ns, name string, args ...string) {
	t.Helper()
	_, err := sb.Client().CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			// A refused connection fails at once; a dropped one would wait.
			ActiveDeadlineSeconds: ptr.To[int64](60),
			Containers: []corev1.Container{{
				Name: "cli", Image: image, ImagePullPolicy: corev1.PullNever,
				Args: append(args, "--connect-timeout=10s"),
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// waitPodDone waits until pod ns/name has ended and returns its phase and
// logs.
func waitPodDone(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ns, name string) (corev1.PodPhase, string) {
	t.Helper()
	var pod *corev1.Pod
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		p, err := sb.Client().CoreV1().Pods(ns).Get(wctx, name, metav1.GetOptions{})
		if err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
			pod = p
			break
		}
		select {
		case <-wctx.Done():
			t.Fatalf("pod %s/%s did not end: %v", ns, name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	b, err := sb.Client().CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Logf("logs of %s/%s: %v", ns, name, err)
	}
	return pod.Status.Phase, string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// noSnapshotBytesOnThePodNetwork puts a marker into the etcd of ms, runs
// backup (an agent backing it up) while capturing every frame of the
// node's pod network (an AF_PACKET socket in the node's network
// namespace, as a pod with NET_RAW there would), and checks that the
// marker never crosses it in traffic of the agent port (TLS), while it
// does in the agent's plaintext etcd traffic — the capture's control —
// and at least the snapshot's size went to the agent port.
func noSnapshotBytesOnThePodNetwork(ctx context.Context, t *testing.T, sb *sandbox.Sandbox, ms []*etcdMember, backup func()) {
	t.Helper()
	var rnd [16]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	marker := "etcdbackup-marker-" + hex.EncodeToString(rnd[:])
	ec := etcdClient(t, ms)
	put(t, ec, "/sniffed/marker", strings.Repeat(marker+" ", 64))
	st, err := ec.Status(ctx, ms[0].clientURL.String())
	if err != nil {
		t.Fatal(err)
	}
	capture, err := sb.CapturePodNetwork([]byte(marker))
	if err != nil {
		t.Fatal(err)
	}
	backup()
	ports, err := capture.Stop()
	if err != nil {
		t.Fatal(err)
	}
	agent := ports[50052]
	t.Logf("captured on the agent port: %d packets, %d payload bytes (etcd's database: %d bytes)", agent.Packets, agent.PayloadBytes, st.DbSize)
	if agent.Packets == 0 || agent.PayloadBytes < st.DbSize {
		t.Fatalf("the capture saw %d packets, %d bytes to or from port 50052: less than the snapshot (%d bytes) crossed it, so it proves nothing", agent.Packets, agent.PayloadBytes, st.DbSize)
	}
	if agent.Marker {
		t.Fatal("the marker put into etcd crossed the pod network in the agent port's traffic: the snapshot travels in plaintext")
	}
	var control []uint16
	for p, tr := range ports {
		if tr.Marker {
			control = append(control, p)
		}
	}
	if len(control) == 0 {
		t.Fatal("the capture never saw the marker, not even in the agent's plaintext etcd traffic: it cannot tell")
	}
	t.Logf("the marker was seen in plaintext etcd traffic (ports %v) and not on the agent port", control)
}

// waitJobPod waits for the pod of Job ns/name and returns its name.
func waitJobPod(ctx context.Context, sb *sandbox.Sandbox, ns, name string) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		pods, err := sb.Client().CoreV1().Pods(ns).List(wctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
		if err == nil && len(pods.Items) > 0 {
			return pods.Items[0].Name, nil
		}
		select {
		case <-wctx.Done():
			return "", fmt.Errorf("no pod of Job %s/%s: %v", ns, name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
