package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// inspectObjects is what TestInspectAndExtract writes into its namespace
// besides a Deployment: a CustomResourceDefinition, ConfigMaps (two
// labelled app=shop), a Secret and a custom resource.
const inspectObjects = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.e2e.example.com
spec:
  group: e2e.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, namespace: recover, labels: {app: shop}}
data: {listen: ":8080", mode: production}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: feature-flags, namespace: recover, labels: {app: shop}}
data: {checkout-v2: "true"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: notes, namespace: recover}
data: {todo: "recover me with kubectl create"}
---
apiVersion: v1
kind: Secret
metadata: {name: db-credentials, namespace: recover}
type: Opaque
stringData: {username: shop, password: "s3cr3t-e2e-6f1c"}
`

const inspectWidget = `
apiVersion: e2e.example.com/v1
kind: Widget
metadata: {name: w1, namespace: recover}
spec: {size: 3, color: blue, parts: [a, b]}
`

// What a backup holds, and single objects back without rolling the
// cluster back, on the real API server's storage: a namespace with a
// Deployment, ConfigMaps, a Secret and a custom resource is backed up by
// an agent Job; `inspect` counts per resource exactly what `kubectl get`
// counted when the backup was taken (online and, with the API server
// not asked, through --storage-config); then the objects are deleted and
// `extract … | kubectl apply -f -` (and `| kubectl create -f -`) brings
// each back with the data it had, and the Deployment runs again.
func TestInspectAndExtract(t *testing.T) {
	began := time.Now()
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	product, err := world.InstallProduct(ctx, sb, k, im, t.TempDir(), &testLog{t: t, prefix: "install: "})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	storageConfig := copyStorageConfig(t, c, product)
	cs := sb.Client()

	const ns = "recover"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	manifests := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(manifests, []byte(inspectObjects), 0o600); err != nil {
		t.Fatal(err)
	}
	mustSucceed(t, c.run(t, nil, "apply", "-f", manifests), "apply the objects")
	mustSucceed(t, c.run(t, nil, "wait", "--for", "condition=Established", "crd/widgets.e2e.example.com", "--timeout", "2m"), "wait for the CRD")
	widget := filepath.Join(t.TempDir(), "widget.yaml")
	if err := os.WriteFile(widget, []byte(inspectWidget), 0o600); err != nil {
		t.Fatal(err)
	}
	mustSucceed(t, c.run(t, nil, "apply", "-f", widget), "apply the widget")
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, pauseDeployment(sb, ns, "web"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sb.WaitForDeploymentAvailable(ctx, ns, "web"); err != nil {
		t.Fatal(err)
	}

	// What kubectl sees when the backup is taken. (Once the Deployment's
	// pod runs, the namespace's ServiceAccount and root CA ConfigMap,
	// which the pod needs, exist too; events are left out: they come and
	// go.)
	resources := []string{"configmaps", "secrets", "serviceaccounts", "pods", "deployments.apps", "replicasets.apps", "widgets.e2e.example.com"}
	count := func() map[string]int {
		m := map[string]int{}
		for _, r := range resources {
			out := mustSucceed(t, c.run(t, nil, "get", r, "-n", ns, "-o", "name"), "get "+r).Stdout
			m[r] = len(strings.Fields(out))
		}
		return m
	}
	counted := count()
	originals := mustSucceed(t, c.run(t, nil, "get", "configmaps,secrets,deployments,widgets", "-n", ns, "-o", "json"), "get the originals").Stdout
	mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "control-plane", "--location", "s3", "--name", "objects", "--wait"), "backup --wait")
	if after := count(); !reflect.DeepEqual(after, counted) {
		t.Fatalf("the namespace changed while the backup was taken: %v before, %v after", counted, after)
	}
	t.Logf("kubectl get counted in namespace %s: %v", ns, counted)

	t.Run("inspect", func(t *testing.T) {
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "inspect", "objects", "-o", "json"), "inspect -o json")
		var doc inspectDoc
		if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
			t.Fatalf("%v\n%s", err, r.Stdout)
		}
		for _, name := range resources {
			if got := doc.count(name, ns); got != counted[name] {
				t.Errorf("inspect counts %d %s in %s, kubectl get counted %d", got, name, ns, counted[name])
			}
		}
		// The API server encrypts Secrets at rest: every one is counted
		// as encrypted, by the sandbox's aescbc key.
		for _, r := range doc.Status.Resources {
			if r.Resource != "secrets" {
				continue
			}
			if r.Encrypted != r.Objects || len(r.EncryptedBy) != 1 || r.EncryptedBy[0].Provider != "aescbc" ||
				r.EncryptedBy[0].Key != sandbox.EncryptionKeyName || r.EncryptedBy[0].Objects != r.Objects {
				t.Errorf("secrets: %d objects, %d encrypted, by %+v; want all by aescbc key %s", r.Objects, r.Encrypted, r.EncryptedBy, sandbox.EncryptionKeyName)
			}
		}
		// etcd's own count of live keys is the objects and the rest.
		if doc.Status.Revision == 0 || doc.Status.Objects == 0 || doc.Status.Objects+doc.Status.OtherKeys != doc.Status.TotalKeys ||
			doc.count("customresourcedefinitions.apiextensions.k8s.io", "") == 0 {
			t.Errorf("inspect: %s", r.Stdout)
		}
		t.Logf("inspect: %s", r.Stderr)

		// The API server not asked: the same counts from the bucket.
		offline := mustSucceed(t, c.run(t, []string{"KUBECONFIG=" + os.DevNull}, "etcdbackup", "inspect", "objects", "-o", "json", "--storage-config", storageConfig), "inspect --storage-config")
		var off inspectDoc
		if err := json.Unmarshal([]byte(offline.Stdout), &off); err != nil || !reflect.DeepEqual(off.Status, doc.Status) {
			t.Errorf("inspect --storage-config differs (%v):\n%s", err, offline.Stdout)
		}

		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "inspect", "objects", "-o", "wide"), "inspect -o wide")
		if !tableHasRow(r.Stdout, ns, "widgets.e2e.example.com", "1") || !tableHasRow(r.Stdout, ns, "secrets", "1") {
			t.Errorf("inspect -o wide has no widget row for %s:\n%s", ns, r.Stdout)
		}
		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "inspect", "objects"), "inspect")
		t.Logf("kubectl etcdbackup inspect objects:\n%s", r.Stdout)
	})

	// A restore drill of the control plane's backup: restored into an
	// etcd of its own in the drill agent's pod, its keyspace compared with
	// the HashKV the backup agent recorded.
	t.Run("drill", func(t *testing.T) {
		began := time.Now()
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "drill", "objects", "--location", "s3", "--wait", "--timeout", "5m"), "drill --wait")
		if !strings.Contains(r.Stderr, "succeeded") {
			t.Errorf("drill --wait: %s", r)
		}
		v := mustSucceed(t, c.run(t, nil, "etcdbackup", "get", "objects", "--location", "s3", "-o", "jsonpath={.status.verification.result}"), "get").Stdout
		if strings.TrimSpace(v) != "Succeeded" {
			t.Errorf("verification of the control plane's backup: %q", v)
		}
		t.Logf("drill of the control plane's backup: %s (drill --wait, Job to verdict)\n%s", time.Since(began).Round(100*time.Millisecond), r.Stderr)
	})

	t.Run("extract-and-apply", func(t *testing.T) {
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "extract", "--help"), "extract --help")
		if !strings.Contains(r.Stdout, "SECRET DATA") {
			t.Errorf("extract's help does not warn that the output holds secret data")
		}
		// The Secret is encrypted at rest: without the API server's
		// EncryptionConfiguration it is named and skipped (exit 6), its
		// data nowhere in the output.
		encConfig := sb.EncryptionConfigFile()
		r = c.run(t, nil, "etcdbackup", "extract", "objects", "secrets", "--object-namespace", ns)
		if r.ExitCode != 6 || !strings.Contains(r.Stderr, `secrets "`+ns+`/db-credentials" is encrypted at rest by the API server (aescbc v1, key "`+sandbox.EncryptionKeyName+`")`) ||
			strings.Contains(r.Stdout, "db-credentials") {
			t.Errorf("extract of an encrypted Secret without the encryption config: %s", r)
		}
		// The same objects online and with the API server not asked,
		// the Secret opened with the API server's own configuration.
		online := mustSucceed(t, c.run(t, nil, "etcdbackup", "extract", "objects", "cm,secrets,deploy,wdg", "--object-namespace", ns, "--encryption-config", encConfig), "extract").Stdout
		offline := mustSucceed(t, c.run(t, []string{"KUBECONFIG=" + os.DevNull}, "etcdbackup", "extract", "objects", "cm,secrets,deploy,wdg", "--object-namespace", ns, "--storage-config", storageConfig, "--encryption-config", encConfig), "extract --storage-config").Stdout
		if online != offline {
			t.Errorf("extract online:\n%s\nwith --storage-config:\n%s", online, offline)
		}

		// The Deployment with its ReplicaSet and pod, so that the
		// recovered one starts from nothing.
		mustSucceed(t, c.run(t, nil, "delete", "-n", ns, "deployment/web", "--cascade=foreground", "--wait"), "delete the Deployment")
		mustSucceed(t, c.run(t, nil, "delete", "-n", ns, "configmap/app-config", "configmap/feature-flags", "configmap/notes", "secret/db-credentials", "widget/w1", "--wait"), "delete the objects")
		gone := mustSucceed(t, c.run(t, nil, "get", "configmaps,secrets,deployments,replicasets,widgets", "-n", ns, "-o", "name"), "get after the deletion").Stdout
		if strings.Contains(gone, "app-config") || strings.Contains(gone, "db-credentials") || strings.Contains(gone, "web") || strings.Contains(gone, "w1") {
			t.Fatalf("not deleted: %s", gone)
		}
		for _, script := range []string{
			"kubectl etcdbackup extract objects configmaps -l app=shop --object-namespace " + ns + " | kubectl apply -f -",
			"kubectl etcdbackup extract objects configmap notes --object-namespace " + ns + " -o json | kubectl create -f -",
			"kubectl etcdbackup extract objects deployments,secrets,wdg --object-namespace " + ns + " --encryption-config " + encConfig + " | kubectl apply -f -",
		} {
			sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
			r := world.RunCommand(k.Shell(sctx, script))
			scancel()
			mustSucceed(t, r, script)
			t.Logf("%s\n%s%s", script, r.Stdout, r.Stderr)
		}
		if err := sb.WaitForDeploymentAvailable(ctx, ns, "web"); err != nil {
			t.Fatalf("the recovered Deployment: %v", err)
		}
		now := mustSucceed(t, c.run(t, nil, "get", "configmaps,secrets,deployments,widgets", "-n", ns, "-o", "json"), "get the recovered objects").Stdout
		before, after := listed(t, originals), listed(t, now)
		for _, name := range []string{"ConfigMap/app-config", "ConfigMap/feature-flags", "ConfigMap/notes", "Secret/db-credentials", "Deployment/web", "Widget/w1"} {
			b, a := before[name], after[name]
			switch {
			case a == nil:
				t.Errorf("%s was not recovered", name)
			case a.Metadata.UID == b.Metadata.UID:
				t.Errorf("%s was never deleted", name)
			case !reflect.DeepEqual(a.Data, b.Data) || !reflect.DeepEqual(a.Spec, b.Spec) || !reflect.DeepEqual(a.Metadata.Labels, b.Metadata.Labels):
				t.Errorf("%s recovered as\n%+v\nwas\n%+v", name, a, b)
			}
		}
	})
	t.Logf("inspect and extract on the sandbox: %s in all", time.Since(began).Round(time.Second))
}

// inspectDoc is the part of inspect's document the test reads.
type inspectDoc struct {
	Status struct {
		Revision  int64 `json:"revision"`
		TotalKeys int64 `json:"totalKeys"`
		Objects   int64 `json:"objects"`
		OtherKeys int64 `json:"otherKeys"`
		Resources []struct {
			Resource    string `json:"resource"`
			Group       string `json:"group"`
			Objects     int    `json:"objects"`
			Encrypted   int    `json:"encrypted"`
			EncryptedBy []struct {
				Provider string `json:"provider"`
				Key      string `json:"key"`
				Objects  int    `json:"objects"`
			} `json:"encryptedBy"`
			Namespaces []struct {
				Namespace string `json:"namespace"`
				Objects   int    `json:"objects"`
			} `json:"namespaces"`
		} `json:"resources"`
	} `json:"status"`
}

// count is the number of objects of resource (RESOURCE[.GROUP]) in ns,
// or in all when ns is "".
func (d inspectDoc) count(resource, ns string) int {
	for _, r := range d.Status.Resources {
		name := r.Resource
		if r.Group != "" {
			name += "." + r.Group
		}
		if name != resource {
			continue
		}
		if ns == "" {
			return r.Objects
		}
		for _, n := range r.Namespaces {
			if n.Namespace == ns {
				return n.Objects
			}
		}
	}
	return 0
}

// tableHasRow says whether a line of table starts with these cells.
func tableHasRow(table string, cells ...string) bool {
	want := strings.Join(cells, " ") + " "
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(strings.Join(strings.Fields(l), " ")+" ", want) {
			return true
		}
	}
	return false
}

// listedObject is what is compared of an object before and after.
type listedObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name   string            `json:"name"`
		UID    string            `json:"uid"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
	Spec json.RawMessage   `json:"spec"`
}

// listed reads `kubectl get -o json` output by Kind/name. A Deployment's
// spec is compared as the API server returns it, defaults included.
func listed(t *testing.T, out string) map[string]*listedObject {
	t.Helper()
	var l struct {
		Items []*listedObject `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := map[string]*listedObject{}
	for _, o := range l.Items {
		var spec any
		if len(o.Spec) > 0 {
			if err := json.Unmarshal(o.Spec, &spec); err != nil {
				t.Fatal(err)
			}
			o.Spec, _ = json.Marshal(spec) // canonical: key order, spacing
		}
		m[o.Kind+"/"+o.Metadata.Name] = o
	}
	return m
}
