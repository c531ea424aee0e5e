package kubetest

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Fixture is a small cluster's worth of objects, written into etcd as
// kube-apiserver writes them, and the snapshot of it. Its content:
//
//	namespaces                        app, other
//	configmaps     app                settings (tier=web), owned (owned by Deployment web),
//	                                  updated (written twice: data version=2), deleted (deleted: a tombstone)
//	               other              settings (tier=db)
//	secrets        app                db (password: s3cr3t), sealed (encrypted: aescbc, key1)
//	               other              kms (encrypted: kms v2, plugin vault)
//	deployments    app                web (with the metadata and status the API server sets)
//	services       app                web
//	customresourcedefinitions          widgets.example.com (namespaced, status subresource, short name wd),
//	                                  gadgets.example.com (cluster-scoped, no subresources)
//	widgets        app                w1 (JSON), other: w2 (CBOR)
//	gadgets                           g1 (JSON, with status)
//	apiservices                       v1.example.org (protobuf of a type client-go does not have)
//	masterleases, ranges              kube-apiserver's own records
//	compact_rev_key                   outside /registry
type Fixture struct {
	// Path is the snapshot file.
	Path string
	// The objects as written.
	Settings, Owned, Updated, OtherSettings *corev1.ConfigMap
	DB                                      *corev1.Secret
	Web                                     *appsv1.Deployment
	Service                                 *corev1.Service
	Widgets, Gadgets                        *apiextensionsv1.CustomResourceDefinition
	W1, W2, G1                              *unstructured.Unstructured
}

// FixtureObjects is the number of live keys under /registry the fixture
// holds; FixtureEncrypted those encrypted at rest.
const (
	FixtureObjects   = 19
	FixtureEncrypted = 2
)

// WriteFixture writes the fixture into a new etcd member and snapshots
// it.
func WriteFixture(t testing.TB) *Fixture {
	t.Helper()
	e := Start(t)
	f := &Fixture{}
	created := metav1.NewTime(time.Date(2026, 1, 31, 2, 0, 0, 0, time.UTC))
	meta := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), CreationTimestamp: created,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:data":{}}`)}},
		}
	}
	put := func(key string, obj runtime.Object) { e.Put(key, Protobuf(t, obj)) }

	for _, ns := range []string{"app", "other"} {
		put("/registry/namespaces/"+ns, &corev1.Namespace{ObjectMeta: meta("", ns), Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{"kubernetes"}}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}})
	}

	f.Settings = &corev1.ConfigMap{ObjectMeta: meta("app", "settings"), Data: map[string]string{"a": "1"}}
	f.Settings.Labels = map[string]string{"tier": "web"}
	f.Settings.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","data":{"a":"1"},"kind":"ConfigMap","metadata":{"name":"settings","namespace":"app"}}` + "\n"}
	put("/registry/configmaps/app/settings", f.Settings)

	f.Owned = &corev1.ConfigMap{ObjectMeta: meta("app", "owned"), Data: map[string]string{"owned": "yes"}}
	f.Owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "uid-app-web", Controller: ptr.To(true)}}
	put("/registry/configmaps/app/owned", f.Owned)

	f.Updated = &corev1.ConfigMap{ObjectMeta: meta("app", "updated"), Data: map[string]string{"version": "1"}}
	put("/registry/configmaps/app/updated", f.Updated)
	f.Updated = f.Updated.DeepCopy()
	f.Updated.Data["version"] = "2"
	put("/registry/configmaps/app/updated", f.Updated)

	put("/registry/configmaps/app/deleted", &corev1.ConfigMap{ObjectMeta: meta("app", "deleted"), Data: map[string]string{"gone": "yes"}})
	e.Delete("/registry/configmaps/app/deleted")

	f.OtherSettings = &corev1.ConfigMap{ObjectMeta: meta("other", "settings"), Data: map[string]string{"b": "2"}}
	f.OtherSettings.Labels = map[string]string{"tier": "db"}
	put("/registry/configmaps/other/settings", f.OtherSettings)

	f.DB = &corev1.Secret{ObjectMeta: meta("app", "db"), Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("s3cr3t")}}
	put("/registry/secrets/app/db", f.DB)
	e.Put("/registry/secrets/app/sealed", Encrypted("k8s:enc:aescbc:v1:key1:", 200))
	e.Put("/registry/secrets/other/kms", Encrypted("k8s:enc:kms:v2:vault:", 300))

	labels := map[string]string{"app": "web"}
	f.Web = &appsv1.Deployment{
		ObjectMeta: meta("app", "web"),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1.0"}}},
			},
		},
		Status: appsv1.DeploymentStatus{Replicas: 2, ReadyReplicas: 2, ObservedGeneration: 3},
	}
	f.Web.Generation = 3
	f.Web.Labels = labels
	put("/registry/deployments/app/web", f.Web)

	f.Service = &corev1.Service{ObjectMeta: meta("app", "web"), Spec: corev1.ServiceSpec{
		Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
	}}
	put("/registry/services/specs/app/web", f.Service)

	version := func(status bool) apiextensionsv1.CustomResourceDefinitionVersion {
		v := apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1", Served: true, Storage: true,
			Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}}}
		if status {
			v.Subresources = &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}
		}
		return v
	}
	f.Widgets = &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: meta("", "widgets.example.com"),
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names:    apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList", ShortNames: []string{"wd"}},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{version(true)},
		},
	}
	put("/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", f.Widgets)
	f.Gadgets = &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: meta("", "gadgets.example.com"),
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com", Scope: apiextensionsv1.ClusterScoped,
			Names:    apiextensionsv1.CustomResourceDefinitionNames{Plural: "gadgets", Singular: "gadget", Kind: "Gadget", ListKind: "GadgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{version(false)},
		},
	}
	put("/registry/apiextensions.k8s.io/customresourcedefinitions/gadgets.example.com", f.Gadgets)

	cr := func(kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "example.com/v1", "kind": kind,
			"metadata": map[string]any{"name": name, "uid": "uid-" + name, "creationTimestamp": "2026-01-31T02:00:00Z", "generation": int64(1)},
			"spec":     spec,
			"status":   map[string]any{"ready": true},
		}}
		if ns != "" {
			u.SetNamespace(ns)
		}
		return u
	}
	f.W1 = cr("Widget", "app", "w1", map[string]any{"size": int64(3), "color": "blue"})
	e.Put("/registry/example.com/widgets/app/w1", JSON(t, f.W1))
	f.W2 = cr("Widget", "other", "w2", map[string]any{"size": int64(5), "color": "red"})
	e.Put("/registry/example.com/widgets/other/w2", CBOR(t, f.W2))
	f.G1 = cr("Gadget", "", "g1", map[string]any{"mode": "fast"})
	e.Put("/registry/example.com/gadgets/g1", JSON(t, f.G1))

	// A type of an extension API server (kube-aggregator's), which
	// client-go's scheme does not have: the envelope names it.
	unknown := &runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "apiregistration.k8s.io/v1", Kind: "APIService"}, Raw: []byte{0x0a, 0x00}}
	raw, err := unknown.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	e.Put("/registry/apiregistration.k8s.io/apiservices/v1.example.org", append([]byte("k8s\x00"), raw...))

	// kube-apiserver keeps its masterleases as core/v1 Endpoints.
	//lint:ignore SA1019 the type kube-apiserver stores, deprecated or not
	lease := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "192.0.2.10"}, Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "192.0.2.10"}}}}}
	put("/registry/masterleases/192.0.2.10", lease)
	put("/registry/ranges/serviceips", &corev1.RangeAllocation{Range: "10.96.0.0/12", Data: []byte{1}})
	e.Put("compact_rev_key", []byte("7"))

	f.Path = e.Snapshot()
	return f
}
