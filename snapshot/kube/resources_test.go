package kube

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
)

// Every built-in of the table is a type of client-go's scheme, under the
// resource name kubectl derives from its kind: a typo would make a
// resource unreachable by name, or its objects undecodable.
func TestBuiltinsAreSchemeTypes(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range builtins {
		r := b.toResource()
		if seen[r.Path] {
			t.Errorf("path %q twice", r.Path)
		}
		seen[r.Path] = true
		if b.group == "apiregistration.k8s.io" {
			continue // kube-aggregator's, not in client-go
		}
		found := false
		for gvk := range Scheme().AllKnownTypes() {
			if gvk.Group == b.group && gvk.Kind == b.kind {
				found = true
				if plural, _ := meta.UnsafeGuessKindToResource(gvk); plural.Resource != b.resource {
					t.Errorf("%s: kind %s is resource %q", r, b.kind, plural.Resource)
				}
			}
		}
		if !found {
			t.Errorf("%s: no kind %s in group %q of client-go's scheme", r, b.kind, b.group)
		}
	}
}

// kubectl's names for a resource find it; the group qualifies; built-ins
// come before custom resources of the same name; two custom resources of
// one name need their group; kube-apiserver's own records and unknown
// names are refused with a reason.
func TestLookup(t *testing.T) {
	custom := func(group, plural, kind string, short ...string) Resource {
		return Resource{Group: group, Resource: plural, Kind: kind, Singular: strings.ToLower(kind), ShortNames: short, Namespaced: true, Path: group + "/" + plural, Custom: true}
	}
	cat := newCatalog([]Resource{
		custom("example.com", "widgets", "Widget", "wd"),
		custom("a.example", "certificates", "Certificate", "cert"),
		custom("b.example", "certificates", "Certificate"),
		custom("example.com", "events", "Event"),
	}, []string{"configmaps", "newthings", "nodef.example/things"})
	for name, want := range map[string]string{
		"configmaps": "configmaps", "configmap": "configmaps", "ConfigMap": "configmaps", "cm": "configmaps",
		"configmaps.v1": "configmaps", "deployments.apps": "deployments.apps", "deploy": "deployments.apps",
		"deployment.v1.apps": "deployments.apps", "Deployment.apps": "deployments.apps", "svc": "services",
		"services": "services", "ep": "endpoints", "no": "nodes", "ing": "ingresses.networking.k8s.io",
		"crd": "customresourcedefinitions.apiextensions.k8s.io", "apiservices": "apiservices.apiregistration.k8s.io",
		"widgets": "widgets.example.com", "wd": "widgets.example.com", "Widget": "widgets.example.com",
		"widgets.v1.example.com": "widgets.example.com", "cert": "certificates.a.example",
		"certificates.b.example": "certificates.b.example", "events": "events", "events.example.com": "events.example.com",
		"newthings": "newthings", "things.nodef.example": "things.nodef.example",
	} {
		r, err := cat.Lookup(name)
		if err != nil || r.String() != want {
			t.Errorf("Lookup(%q) = %s, %v; want %s", name, r, err, want)
		}
	}
	for name, want := range map[string]string{
		"certificates":            "ambiguous",
		"masterleases":            "kube-apiserver's own record",
		"nosuch":                  "has no resource type",
		"deployments.example.com": "has no resource type",
		"":                        "no resource named",
	} {
		if _, err := cat.Lookup(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Lookup(%q): %v, want %q", name, err, want)
		}
	}
	if r := cat.ForPath("services/specs"); r.String() != "services" || !r.Namespaced {
		t.Errorf("services/specs is %+v", r)
	}
}

// kube-apiserver's key layout splits into resource path, namespace and
// name.
func TestSplitKey(t *testing.T) {
	for key, want := range map[string][3]string{
		"configmaps/ns/name":        {"configmaps", "ns", "name"},
		"namespaces/ns":             {"namespaces", "", "ns"},
		"services/specs/ns/web":     {"services/specs", "ns", "web"},
		"services/endpoints/ns/web": {"services/endpoints", "ns", "web"},
		"example.com/widgets/ns/w":  {"example.com/widgets", "ns", "w"},
		"example.com/gadgets/g":     {"example.com/gadgets", "", "g"},
		"ranges/serviceips":         {"ranges", "", "serviceips"},
		"masterleases/2001:db8::1":  {"masterleases", "", "2001:db8::1"},
		"odd/a/b/c":                 {"odd", "", "a/b/c"},
		"apiextensions.k8s.io/customresourcedefinitions/w.example.com": {"apiextensions.k8s.io/customresourcedefinitions", "", "w.example.com"},
	} {
		res, ns, name := splitKey(key)
		if got := [3]string{res, ns, name}; got != want {
			t.Errorf("splitKey(%q) = %q, want %q", key, got, want)
		}
	}
}

// The encryption prefixes of kube-apiserver's providers are read as
// provider, format and key; anything else is not encrypted.
func TestEncryptionOf(t *testing.T) {
	for value, want := range map[string]string{
		"k8s:enc:aescbc:v1:key1:\x00\x01": `aescbc v1, key "key1"`,
		"k8s:enc:aesgcm:v1:second:xyz":    `aesgcm v1, key "second"`,
		"k8s:enc:secretbox:v1:k:":         `secretbox v1, key "k"`,
		"k8s:enc:kms:v2:vault:\n\x05":     `kms v2, plugin "vault"`,
		"k8s:enc:newthing":                `newthing`,
	} {
		e := encryptionOf([]byte(value))
		if e == nil || e.String() != want {
			t.Errorf("encryptionOf(%q) = %v, want %s", value, e, want)
		}
	}
	if encryptionOf([]byte("k8s\x00rest")) != nil || encryptionOf([]byte(`{"kind":"x"}`)) != nil {
		t.Error("a plain value is taken for encrypted")
	}
}
