package plugin

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube"
)

// items reads extract's output (a List, or one object) as objects.
func extractedItems(t *testing.T, out string) []*unstructured.Unstructured {
	t.Helper()
	// Through JSON, numbers stay int64 as in the objects written.
	j, err := yaml.YAMLToJSON([]byte(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := map[string]any{}
	if err := utiljson.Unmarshal(j, &m); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	u := &unstructured.Unstructured{Object: m}
	if u.GetKind() != "List" {
		return []*unstructured.Unstructured{u}
	}
	var out2 []*unstructured.Unstructured
	for _, it := range m["items"].([]any) {
		out2 = append(out2, &unstructured.Unstructured{Object: it.(map[string]any)})
	}
	return out2
}

func namesOf(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		n := o.GetKind() + " " + o.GetName()
		if o.GetNamespace() != "" {
			n = o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		}
		out = append(out, n)
	}
	return out
}

// Objects come back as they were written, as manifests: the latest
// revision, the deleted one absent, what the API server sets removed,
// ownerReferences only with --keep-owner-references; one named object
// is printed as itself, more as a List.
func TestExtractConfigMaps(t *testing.T) {
	f, path := kubeFixture(t)
	r := mustRun(t, "extract", "fx", "configmaps", "--from-file", path, "--object-namespace", "app")
	objs := extractedItems(t, r.out)
	if got := namesOf(objs); !reflect.DeepEqual(got, []string{"ConfigMap app/owned", "ConfigMap app/settings", "ConfigMap app/updated"}) {
		t.Fatalf("configmaps of app: %v", got)
	}
	want := map[string]*corev1.ConfigMap{"owned": f.Owned, "settings": f.Settings, "updated": f.Updated}
	for _, o := range objs {
		for _, field := range kube.ServerSetMetadata {
			if _, ok := o.Object["metadata"].(map[string]any)[field]; ok {
				t.Errorf("%s keeps metadata.%s", o.GetName(), field)
			}
		}
		var cm corev1.ConfigMap
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cm); err != nil {
			t.Fatal(err)
		}
		w := want[cm.Name]
		if !reflect.DeepEqual(cm.Data, w.Data) || !equality.Semantic.DeepEqual(cm.Labels, w.Labels) || !equality.Semantic.DeepEqual(cm.Annotations, w.Annotations) || len(cm.OwnerReferences) != 0 {
			t.Errorf("%s: %+v, want data %v labels %v annotations %v", cm.Name, cm, w.Data, w.Labels, w.Annotations)
		}
	}
	if !strings.Contains(r.errOut, `ownerReferences removed from 1 object`) || !strings.Contains(r.errOut, `configmaps "app/owned" (owned by Deployment/web)`) ||
		!strings.Contains(r.errOut, `3 objects from namespace "app" of backup "fx"`) {
		t.Errorf("stderr: %s", r.errOut)
	}

	r = mustRun(t, "extract", "fx", "cm", "owned", "--from-file", path, "--object-namespace", "app", "--keep-owner-references", "-o", "json")
	objs = extractedItems(t, r.out)
	if len(objs) != 1 || objs[0].GetKind() != "ConfigMap" || !reflect.DeepEqual(objs[0].GetOwnerReferences(), f.Owned.OwnerReferences) || strings.Contains(r.errOut, "ownerReferences") {
		t.Errorf("--keep-owner-references: %s\n%s", r.out, r.errOut)
	}

	r = mustRun(t, "extract", "fx", "ConfigMap", "-A", "-l", "tier=db", "--from-file", path, "-o", "name")
	if r.out != "configmap/settings\n" {
		t.Errorf("-A -l tier=db -o name: %q", r.out)
	}
	if objs := extractedItems(t, mustRun(t, "extract", "fx", "configmaps.v1", "settings", "--from-file", path, "--object-namespace", "other").out); len(objs) != 1 || objs[0].GetNamespace() != "other" {
		t.Errorf("settings of other: %v", namesOf(objs))
	}

	// A named object not in the backup: the others are printed, exit 3.
	r = run(t, "extract", "fx", "cm", "settings", "deleted", "--from-file", path, "--object-namespace", "app")
	if ExitCode(r.err) != ExitNotFound || !strings.Contains(r.err.Error(), `configmaps "deleted"`) || !reflect.DeepEqual(namesOf(extractedItems(t, r.out)), []string{"ConfigMap app/settings"}) {
		t.Errorf("a deleted object: exit %d %v\n%s", ExitCode(r.err), r.err, r.out)
	}
	// Nothing there: an empty List, said on stderr.
	r = mustRun(t, "extract", "fx", "cm", "--from-file", path, "--object-namespace", "empty")
	if len(extractedItems(t, r.out)) != 0 || !strings.Contains(r.errOut, `No cm found in namespace "empty"`) {
		t.Errorf("an empty namespace: %s %s", r.out, r.errOut)
	}
}

// Without --object-namespace or -A the kubeconfig context's namespace
// is the objects' (-n stays the server's).
func TestExtractContextNamespace(t *testing.T) {
	_, path := kubeFixture(t)
	kubeconfig := filepath.Join(t.TempDir(), "config")
	os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {}}]
contexts:
- {name: in-other, context: {cluster: c, user: u, namespace: other}}
- {name: plain, context: {cluster: c, user: u}}
current-context: in-other
`), 0o600)
	r := mustRun(t, "extract", "fx", "cm", "--from-file", path, "--kubeconfig", kubeconfig)
	if got := namesOf(extractedItems(t, r.out)); !reflect.DeepEqual(got, []string{"ConfigMap other/settings"}) {
		t.Errorf("context namespace other: %v", got)
	}
	r = mustRun(t, "extract", "fx", "cm", "--from-file", path, "--kubeconfig", kubeconfig, "--context", "plain")
	if len(extractedItems(t, r.out)) != 0 || !strings.Contains(r.errOut, `namespace "default"`) {
		t.Errorf("a context without a namespace: %s %s", r.out, r.errOut)
	}
	r = run(t, "extract", "fx", "cm", "--from-file", path, "-n", "app")
	if ExitCode(r.err) != ExitUsage || !strings.Contains(r.err.Error(), "--object-namespace") {
		t.Errorf("-n with --from-file: %v", r.err)
	}
}

// Secrets are printed with their data; those encrypted at rest are named
// with their provider and key on stderr and skipped, exit 6; custom
// resources decode from JSON and CBOR and keep status only without a
// status subresource; unknown names and types are refused.
func TestExtractSecretsAndCustomResources(t *testing.T) {
	f, path := kubeFixture(t)
	r := run(t, "extract", "fx", "secrets", "-A", "--from-file", path)
	objs := extractedItems(t, r.out)
	if got := namesOf(objs); !reflect.DeepEqual(got, []string{"Secret app/db"}) {
		t.Fatalf("secrets: %v\n%s", got, r.errOut)
	}
	if pw, _, _ := unstructured.NestedString(objs[0].Object, "data", "password"); pw != base64.StdEncoding.EncodeToString(f.DB.Data["password"]) {
		t.Errorf("secret data %q", pw)
	}
	if ExitCode(r.err) != ExitIncomplete ||
		!strings.Contains(r.errOut, `secrets "app/sealed" is encrypted at rest by the API server (aescbc v1, key "key1")`) ||
		!strings.Contains(r.errOut, `secrets "other/kms" is encrypted at rest by the API server (kms v2, plugin "vault")`) ||
		strings.Contains(r.out, "k8s:enc") {
		t.Errorf("encrypted secrets: exit %d %v\n%s", ExitCode(r.err), r.err, r.errOut)
	}
	// Named, an encrypted object is found but skipped: exit 6, not 3.
	if r := run(t, "extract", "fx", "secret", "sealed", "--object-namespace", "app", "--from-file", path); ExitCode(r.err) != ExitIncomplete {
		t.Errorf("named encrypted secret: exit %d %v", ExitCode(r.err), r.err)
	}

	objs = extractedItems(t, mustRun(t, "extract", "fx", "widgets.example.com,gadget", "-A", "--from-file", path).out)
	if got := namesOf(objs); !reflect.DeepEqual(got, []string{"Widget app/w1", "Widget other/w2", "Gadget g1"}) {
		t.Fatalf("custom resources: %v", got)
	}
	for i, want := range []*unstructured.Unstructured{f.W1, f.W2, f.G1} {
		if !reflect.DeepEqual(objs[i].Object["spec"], want.Object["spec"]) {
			t.Errorf("%s spec %v, want %v", want.GetName(), objs[i].Object["spec"], want.Object["spec"])
		}
	}
	if objs[0].Object["status"] != nil || objs[2].Object["status"] == nil {
		t.Errorf("status: widget (subresource) %v, gadget (none) %v", objs[0].Object["status"], objs[2].Object["status"])
	}

	r = run(t, "extract", "fx", "apiservices", "--from-file", path)
	if ExitCode(r.err) != ExitIncomplete || !strings.Contains(r.errOut, "APIService, a type this build of the plugin does not know") {
		t.Errorf("an unknown type: %v\n%s", r.err, r.errOut)
	}
	mustFail(t, `has no resource type "gizmos"`, "extract", "fx", "gizmos", "--from-file", path)
	mustFail(t, "kube-apiserver's own record", "extract", "fx", "ranges", "--from-file", path)
}

// Flags that do not go together are usage errors, before anything is
// read.
func TestExtractUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"extract", "b", "cm", "-A", "--object-namespace", "x"}, "not both"},
		{[]string{"extract", "b", "cm,secrets", "x"}, "object names go with one resource type"},
		{[]string{"extract", "b", "cm", "x", "-A"}, "drop -A"},
		{[]string{"extract", "b", "cm", "x", "-l", "a=b"}, "not both"},
		{[]string{"extract", "b", "cm", "-l", "a=(b"}, "-l"},
		{[]string{"extract", "b", "cm", "-o", "table"}, "not a known output format"},
		{[]string{"extract", "b", ","}, "name the resource type"},
		{[]string{"extract", "b"}, "requires at least 2 arg(s)"},
	} {
		r := run(t, append(c.args, "--server-address", nowhere)...)
		if ExitCode(r.err) != ExitUsage || !strings.Contains(r.err.Error(), c.want) {
			t.Errorf("%v: exit %d %v, want usage error %q", c.args, ExitCode(r.err), r.err, c.want)
		}
	}
}

// Online the backup comes through the server (decrypted with
// --identity), and with --storage-config from its location: the same
// objects as from the file.
func TestExtractOnline(t *testing.T) {
	_, path := kubeFixture(t)
	fakeCluster(t, nil) // owners gone: removed, as from the file
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	key := agetest.NewKey(t)
	mustRun(t, addr, "upload", path, "--name", "sealed", "--encrypt-to", key.Recipient)
	want := mustRun(t, "extract", "fx", "deploy,cm,wd", "--object-namespace", "app", "--from-file", path).out
	mustFail(t, "--identity", addr, "extract", "sealed", "cm", "--object-namespace", "app")
	if got := mustRun(t, addr, "extract", "sealed", "deploy,cm,wd", "--object-namespace", "app", "--identity", key.File).out; got != want {
		t.Errorf("online:\n%s\nfrom the file:\n%s", got, want)
	}
	srv.Stop()
	useBreakGlass(t)
	cfg := writeConfig(t, fmt.Sprintf("locations:\n  - name: default\n    filesystem: {path: %s}\n", srv.Dir))
	if got := mustRun(t, "extract", "sealed", "deploy,cm,wd", "--object-namespace", "app", "--identity", key.File, "--storage-config", cfg).out; got != want {
		t.Errorf("--storage-config:\n%s", got)
	}
}
