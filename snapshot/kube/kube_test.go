package kube_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	bolt "go.etcd.io/bbolt"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube/kubetest"
)

func open(t *testing.T, path, prefix string) (*kube.Snapshot, *kube.Catalog) {
	t.Helper()
	s, err := kube.Open(path, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	cat, errs := s.Catalog()
	if len(errs) > 0 {
		t.Fatalf("catalog: %v", errs)
	}
	return s, cat
}

func resourceOf(t *testing.T, c *kube.Contents, name string) kube.ResourceContents {
	t.Helper()
	for _, r := range c.Resources {
		if r.Resource.String() == name {
			return r
		}
	}
	t.Fatalf("no %s in %+v", name, c.Resources)
	return kube.ResourceContents{}
}

// The fixture's keys counted as written: the latest revision of each
// key, a deleted one gone, per resource and namespace, the encrypted
// ones counted, kube-apiserver's own records and the keys outside the
// prefix told apart; the revision is etcd's own.
func TestContents(t *testing.T) {
	f := kubetest.WriteFixture(t)
	st, err := snapshot.Check(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	s, cat := open(t, f.Path, "")
	c := s.Contents(cat)
	if c.Revision != st.Revision || c.Prefix != "/registry/" {
		t.Errorf("revision %d prefix %q; etcd says revision %d", c.Revision, c.Prefix, st.Revision)
	}
	// etcd's own count of live keys agrees.
	if c.Objects+c.OtherKeys != st.TotalKey {
		t.Errorf("%d objects and %d other keys; etcd counts %d keys", c.Objects, c.OtherKeys, st.TotalKey)
	}
	if c.Objects != kubetest.FixtureObjects || c.Encrypted != kubetest.FixtureEncrypted || c.OtherKeys != 1 || c.OtherBytes != 1 {
		t.Errorf("counts %+v other %d/%d", c.Count, c.OtherKeys, c.OtherBytes)
	}
	var names []string
	for _, r := range c.Resources {
		names = append(names, r.Resource.String())
	}
	want := []string{
		"apiservices.apiregistration.k8s.io", "configmaps", "customresourcedefinitions.apiextensions.k8s.io", "deployments.apps",
		"gadgets.example.com", "namespaces", "secrets", "services", "widgets.example.com",
		"masterleases", "ranges",
	}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("resources\n%v\nwant\n%v", names, want)
	}

	cm := resourceOf(t, c, "configmaps")
	size := func(objs ...runtime.Object) int64 {
		var n int64
		for _, o := range objs {
			n += int64(len(kubetest.Protobuf(t, o)))
		}
		return n
	}
	if cm.Objects != 4 || cm.Bytes != size(f.Settings, f.Owned, f.Updated, f.OtherSettings) || !cm.Resource.Namespaced {
		t.Errorf("configmaps %+v", cm)
	}
	if len(cm.Namespaces) != 2 || cm.Namespaces[0].Namespace != "app" || cm.Namespaces[0].Objects != 3 ||
		cm.Namespaces[0].Bytes != size(f.Settings, f.Owned, f.Updated) || cm.Namespaces[1].Namespace != "other" || cm.Namespaces[1].Objects != 1 {
		t.Errorf("configmaps per namespace %+v", cm.Namespaces)
	}
	sec := resourceOf(t, c, "secrets")
	if sec.Objects != 3 || sec.Encrypted != 2 || sec.Namespaces[0].Encrypted != 1 || sec.Namespaces[1].Encrypted != 1 {
		t.Errorf("secrets %+v", sec)
	}
	w := resourceOf(t, c, "widgets.example.com")
	if !w.Resource.Custom || !w.Resource.Namespaced || w.Resource.Kind != "Widget" || w.Objects != 2 {
		t.Errorf("widgets %+v", w)
	}
	g := resourceOf(t, c, "gadgets.example.com")
	if !g.Resource.Custom || g.Resource.Namespaced || g.Objects != 1 || len(g.Namespaces) != 0 {
		t.Errorf("gadgets %+v", g)
	}
	if svc := resourceOf(t, c, "services"); svc.Resource.Path != "services/specs" || svc.Objects != 1 {
		t.Errorf("services %+v", svc)
	}
	if ml := resourceOf(t, c, "masterleases"); !ml.Resource.Internal || ml.Objects != 1 {
		t.Errorf("masterleases %+v", ml)
	}

	// Under another prefix the same snapshot holds no objects: every
	// live key is outside it.
	s2, cat2 := open(t, f.Path, "/kubernetes.io")
	if c2 := s2.Contents(cat2); c2.Objects != 0 || c2.OtherKeys != kubetest.FixtureObjects+1 || len(c2.Resources) != 0 {
		t.Errorf("under /kubernetes.io: %+v", c2)
	}
}

// collect gathers what Objects gives, the readable objects by
// namespace/name and the errors.
func collect(t *testing.T, s *kube.Snapshot, sel kube.Selection) (map[string]*unstructured.Unstructured, []error) {
	t.Helper()
	objs := map[string]*unstructured.Unstructured{}
	var errs []error
	err := s.Objects(sel, func(o kube.Object, err error) error {
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		if o.Object.GetName() != o.Name || o.Object.GetNamespace() != o.Namespace || o.Revision <= 0 {
			t.Errorf("object %s/%s at %d is %s/%s", o.Namespace, o.Name, o.Revision, o.Object.GetNamespace(), o.Object.GetName())
		}
		objs[o.Namespace+"/"+o.Name] = o.Object
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs, errs
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func lookup(t *testing.T, cat *kube.Catalog, name string) kube.Resource {
	t.Helper()
	r, err := cat.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Objects decode from every storage encoding kube-apiserver writes —
// protobuf of built-in and CRD types, JSON and CBOR custom resources —
// back to what was written; the latest revision wins, a deleted object
// is gone; selections by namespace, name and labels; encrypted values
// and unknown types come back as errors naming the object.
func TestObjects(t *testing.T) {
	f := kubetest.WriteFixture(t)
	s, cat := open(t, f.Path, "")
	cms := lookup(t, cat, "cm")

	objs, errs := collect(t, s, kube.Selection{Resource: cms, Namespace: "app"})
	if got := keys(objs); len(errs) > 0 || !reflect.DeepEqual(got, []string{"app/owned", "app/settings", "app/updated"}) {
		t.Fatalf("configmaps in app: %v %v", got, errs)
	}
	var updated corev1.ConfigMap
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs["app/updated"].Object, &updated); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(updated.Data, f.Updated.Data) || updated.Data["version"] != "2" {
		t.Errorf("updated: %v, want the latest %v", updated.Data, f.Updated.Data)
	}
	var settings corev1.ConfigMap
	_ = runtime.DefaultUnstructuredConverter.FromUnstructured(objs["app/settings"].Object, &settings)
	if !equality.Semantic.DeepEqual(settings.ObjectMeta, f.Settings.ObjectMeta) || !reflect.DeepEqual(settings.Data, f.Settings.Data) {
		t.Errorf("settings decoded as\n%+v\nwant\n%+v", settings, f.Settings)
	}

	sel, _ := labels.Parse("tier=web")
	if objs, _ := collect(t, s, kube.Selection{Resource: cms, Labels: sel}); !reflect.DeepEqual(keys(objs), []string{"app/settings"}) {
		t.Errorf("configmaps -l tier=web: %v", keys(objs))
	}
	if objs, _ := collect(t, s, kube.Selection{Resource: cms, Names: []string{"settings", "deleted"}}); !reflect.DeepEqual(keys(objs), []string{"app/settings", "other/settings"}) {
		t.Errorf("configmaps settings deleted, every namespace: %v", keys(objs))
	}

	objs, errs = collect(t, s, kube.Selection{Resource: lookup(t, cat, "secrets")})
	var db corev1.Secret
	_ = runtime.DefaultUnstructuredConverter.FromUnstructured(objs["app/db"].Object, &db)
	if len(objs) != 1 || string(db.Data["password"]) != "s3cr3t" || db.Type != corev1.SecretTypeOpaque {
		t.Errorf("secrets: %v, db %+v", keys(objs), db)
	}
	var encrypted []string
	for _, err := range errs {
		var e *kube.EncryptedError
		if !errors.As(err, &e) {
			t.Fatalf("secret error %v, want EncryptedError", err)
		}
		encrypted = append(encrypted, e.Namespace+"/"+e.Name+" "+e.Encryption.String())
	}
	if want := []string{`app/sealed aescbc v1, key "key1"`, `other/kms kms v2, plugin "vault"`}; !reflect.DeepEqual(encrypted, want) {
		t.Errorf("encrypted secrets %q, want %q", encrypted, want)
	}

	objs, errs = collect(t, s, kube.Selection{Resource: lookup(t, cat, "wd")})
	if len(errs) > 0 || len(objs) != 2 ||
		!reflect.DeepEqual(objs["app/w1"].Object["spec"], f.W1.Object["spec"]) || !reflect.DeepEqual(objs["other/w2"].Object["spec"], f.W2.Object["spec"]) {
		t.Errorf("widgets (JSON and CBOR): %v %v", objs, errs)
	}
	objs, _ = collect(t, s, kube.Selection{Resource: lookup(t, cat, "deploy"), Namespace: "app"})
	if d := objs["app/web"]; d == nil || d.GetAPIVersion() != "apps/v1" || d.GetKind() != "Deployment" || d.GetGeneration() != 3 {
		t.Errorf("deployments: %v", objs)
	}
	objs, _ = collect(t, s, kube.Selection{Resource: lookup(t, cat, "svc"), Namespace: "app"})
	if svc := objs["app/web"]; svc == nil || svc.GetKind() != "Service" {
		t.Errorf("services: %v", objs)
	}

	_, errs = collect(t, s, kube.Selection{Resource: lookup(t, cat, "apiservices")})
	var unknown *kube.UnknownTypeError
	if len(errs) != 1 || !errors.As(errs[0], &unknown) || unknown.Kind != "APIService" || unknown.APIVersion != "apiregistration.k8s.io/v1" {
		t.Errorf("apiservices: %v", errs)
	}
}

// Manifest keeps what the object is and drops what the API server sets:
// the metadata it manages, ownerReferences unless asked, status where
// it ignores it; a custom resource without a status subresource keeps
// its status, as data.
func TestManifest(t *testing.T) {
	f := kubetest.WriteFixture(t)
	s, cat := open(t, f.Path, "")
	get := func(resource, ns string) (kube.Resource, map[string]*unstructured.Unstructured) {
		r := lookup(t, cat, resource)
		objs, errs := collect(t, s, kube.Selection{Resource: r, Namespace: ns})
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		return r, objs
	}
	r, deps := get("deployments.apps", "app")
	web := deps["app/web"]
	d := kube.Manifest(web, r, kube.ManifestOptions{})
	for _, field := range kube.ServerSetMetadata {
		if _, ok := web.Object["metadata"].(map[string]any)[field]; ok {
			t.Errorf("deployment keeps metadata.%s", field)
		}
	}
	if _, ok := web.Object["status"]; ok || !d.Status || d.Deleting {
		t.Errorf("deployment status kept or misreported: %+v", d)
	}
	if replicas, _, _ := unstructured.NestedInt64(web.Object, "spec", "replicas"); replicas != 2 || !reflect.DeepEqual(web.GetLabels(), f.Web.Labels) {
		t.Errorf("deployment lost its spec or labels: %v", web.Object)
	}

	r, cms := get("configmaps", "app")
	owned := cms["app/owned"].DeepCopy()
	if d := kube.Manifest(cms["app/owned"], r, kube.ManifestOptions{}); !reflect.DeepEqual(d.OwnerReferences, []string{"Deployment/web"}) || len(cms["app/owned"].GetOwnerReferences()) != 0 {
		t.Errorf("ownerReferences not dropped: %+v", d)
	}
	if d := kube.Manifest(owned, r, kube.ManifestOptions{KeepOwnerReferences: true}); len(d.OwnerReferences) != 0 || len(owned.GetOwnerReferences()) != 1 {
		t.Errorf("--keep-owner-references: %+v %v", d, owned.GetOwnerReferences())
	}
	kube.Manifest(cms["app/settings"], r, kube.ManifestOptions{})
	if cms["app/settings"].GetAnnotations()["kubectl.kubernetes.io/last-applied-configuration"] == "" {
		t.Errorf("last-applied-configuration dropped")
	}

	r, svcs := get("services", "app")
	kube.Manifest(svcs["app/web"], r, kube.ManifestOptions{})
	if ip, _, _ := unstructured.NestedString(svcs["app/web"].Object, "spec", "clusterIP"); ip != "10.96.0.20" {
		t.Errorf("service's clusterIP %q", ip)
	}

	r, ws := get("widgets", "app")
	if d := kube.Manifest(ws["app/w1"], r, kube.ManifestOptions{}); !d.Status {
		t.Errorf("a widget (status subresource) keeps its status")
	}
	r, gs := get("gadgets.example.com", "")
	if d := kube.Manifest(gs["/g1"], r, kube.ManifestOptions{}); d.Status || gs["/g1"].Object["status"] == nil {
		t.Errorf("a gadget (no status subresource) loses its status")
	}
}

// Only the latest state of each key counts, whatever compaction left:
// a key written, deleted and written again is live with its last value;
// one compacted away after its deletion is gone.
func TestCompactedHistory(t *testing.T) {
	e := kubetest.Start(t)
	cm := func(name, v string) []byte {
		return kubetest.Protobuf(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Data: map[string]string{"v": v}})
	}
	e.Put("/registry/configmaps/ns/again", cm("again", "1"))
	e.Delete("/registry/configmaps/ns/again")
	e.Put("/registry/configmaps/ns/gone", cm("gone", "1"))
	e.Delete("/registry/configmaps/ns/gone")
	resp, err := e.Client.Get(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Compact(context.Background(), resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	e.Put("/registry/configmaps/ns/again", cm("again", "2"))
	s, cat := open(t, e.Snapshot(), "")
	c := s.Contents(cat)
	if c.Objects != 1 {
		t.Fatalf("live objects %d, want 1", c.Objects)
	}
	objs, _ := collect(t, s, kube.Selection{Resource: lookup(t, cat, "configmaps")})
	if v, _, _ := unstructured.NestedString(objs["ns/again"].Object, "data", "v"); v != "2" {
		t.Errorf("again: %v", objs)
	}
}

// A file that is not an etcd database is refused; so is a bolt database
// without etcd's key bucket.
func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Open(junk, ""); err == nil {
		t.Error("a file of zeros opened")
	}
	other := filepath.Join(dir, "other.db")
	db, err := bolt.Open(other, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("mine")); return err })
	db.Close()
	if _, err := kube.Open(other, ""); !errors.Is(err, kube.ErrNotEtcd) {
		t.Errorf("a bolt database of another program: %v", err)
	}
	if _, err := kube.Open(other, "registry"); err == nil {
		t.Error("a prefix without its leading slash accepted")
	}
}
