package kube

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Resource is a kind of object a snapshot can hold, and where
// kube-apiserver keeps it.
type Resource struct {
	// Group and Resource name it as the API does: "apps", "deployments";
	// "" is the core group.
	Group, Resource string
	// Kind, Singular and ShortNames are the other names kubectl accepts
	// for it.
	Kind       string
	Singular   string
	ShortNames []string
	// Namespaced is whether its objects live in namespaces.
	Namespaced bool
	// Path is where kube-apiserver keeps its objects, under the prefix:
	// "deployments", "services/specs", "example.com/widgets".
	Path string
	// Custom is a resource a CustomResourceDefinition in the snapshot
	// defines.
	Custom bool
	// Internal marks kube-apiserver's own records (masterleases, ranges):
	// kept in the same store, but not objects of an API resource.
	Internal bool
	// Unknown is a path this package has no resource for (a built-in
	// newer than this build, or custom resources whose definition is not
	// in the snapshot), named after the path.
	Unknown bool
	// statusData lists the versions of a custom resource that have no
	// status subresource: there status is the object's own data, which
	// an apply or a create keeps.
	statusData map[string]bool
}

// String is the name kubectl shows: "configmaps", "deployments.apps".
func (r Resource) String() string {
	if r.Group == "" {
		return r.Resource
	}
	return r.Resource + "." + r.Group
}

// KeepsStatus says whether an object of this resource at version keeps
// its status when written back: only a custom resource version without
// a status subresource (or one whose definition is not in the
// snapshot), for which status is data like spec. For every built-in type
// and every status subresource the API server ignores status on create
// and apply, so it is only noise in a manifest.
func (r Resource) KeepsStatus(version string) bool {
	if r.Custom {
		return r.statusData[version]
	}
	return r.Unknown && strings.Contains(r.Path, ".")
}

// builtin is one built-in resource: group, resource, kind, scope, short
// names and, where kube-apiserver does not keep it under its resource
// name, its path (kube-apiserver's SpecialDefaultResourcePrefixes and the
// API groups served by extension servers, as Kubernetes'
// test/integration/etcd/data.go records them).
type builtin struct {
	group, resource, kind string
	namespaced            bool
	path                  string
	short                 []string
}

const namespaced, cluster = true, false

// builtins are the resources kube-apiserver stores, as of Kubernetes
// 1.37 (alpha ones included: a cluster may enable them).
var builtins = []builtin{
	{"", "pods", "Pod", namespaced, "", []string{"po"}},
	{"", "podtemplates", "PodTemplate", namespaced, "", nil},
	{"", "replicationcontrollers", "ReplicationController", namespaced, "controllers", []string{"rc"}},
	{"", "services", "Service", namespaced, "services/specs", []string{"svc"}},
	{"", "endpoints", "Endpoints", namespaced, "services/endpoints", []string{"ep"}},
	{"", "nodes", "Node", cluster, "minions", []string{"no"}},
	{"", "namespaces", "Namespace", cluster, "", []string{"ns"}},
	{"", "configmaps", "ConfigMap", namespaced, "", []string{"cm"}},
	{"", "secrets", "Secret", namespaced, "", nil},
	{"", "serviceaccounts", "ServiceAccount", namespaced, "", []string{"sa"}},
	{"", "persistentvolumes", "PersistentVolume", cluster, "", []string{"pv"}},
	{"", "persistentvolumeclaims", "PersistentVolumeClaim", namespaced, "", []string{"pvc"}},
	{"", "events", "Event", namespaced, "", []string{"ev"}},
	{"", "limitranges", "LimitRange", namespaced, "", []string{"limits"}},
	{"", "resourcequotas", "ResourceQuota", namespaced, "", []string{"quota"}},
	{"admissionregistration.k8s.io", "mutatingadmissionpolicies", "MutatingAdmissionPolicy", cluster, "", nil},
	{"admissionregistration.k8s.io", "mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding", cluster, "", nil},
	{"admissionregistration.k8s.io", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", cluster, "", nil},
	{"admissionregistration.k8s.io", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", cluster, "", nil},
	{"admissionregistration.k8s.io", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", cluster, "", nil},
	{"admissionregistration.k8s.io", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", cluster, "", nil},
	{"apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", cluster, "apiextensions.k8s.io/customresourcedefinitions", []string{"crd", "crds"}},
	{"apiregistration.k8s.io", "apiservices", "APIService", cluster, "apiregistration.k8s.io/apiservices", nil},
	{"apps", "controllerrevisions", "ControllerRevision", namespaced, "", nil},
	{"apps", "daemonsets", "DaemonSet", namespaced, "", []string{"ds"}},
	{"apps", "deployments", "Deployment", namespaced, "", []string{"deploy"}},
	{"apps", "replicasets", "ReplicaSet", namespaced, "", []string{"rs"}},
	{"apps", "statefulsets", "StatefulSet", namespaced, "", []string{"sts"}},
	{"autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler", namespaced, "", []string{"hpa"}},
	{"batch", "cronjobs", "CronJob", namespaced, "", []string{"cj"}},
	{"batch", "jobs", "Job", namespaced, "", nil},
	{"certificates.k8s.io", "certificatesigningrequests", "CertificateSigningRequest", cluster, "", []string{"csr"}},
	{"certificates.k8s.io", "clustertrustbundles", "ClusterTrustBundle", cluster, "", nil},
	{"certificates.k8s.io", "podcertificaterequests", "PodCertificateRequest", namespaced, "", nil},
	{"coordination.k8s.io", "leasecandidates", "LeaseCandidate", namespaced, "", nil},
	{"coordination.k8s.io", "leases", "Lease", namespaced, "", nil},
	{"discovery.k8s.io", "endpointslices", "EndpointSlice", namespaced, "", nil},
	{"flowcontrol.apiserver.k8s.io", "flowschemas", "FlowSchema", cluster, "", nil},
	{"flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations", "PriorityLevelConfiguration", cluster, "", nil},
	{"internal.apiserver.k8s.io", "storageversions", "StorageVersion", cluster, "", nil},
	{"lifecycle.k8s.io", "evictionrequests", "EvictionRequest", namespaced, "", nil},
	{"networking.k8s.io", "ingressclasses", "IngressClass", cluster, "", nil},
	{"networking.k8s.io", "ingresses", "Ingress", namespaced, "ingress", []string{"ing"}},
	{"networking.k8s.io", "ipaddresses", "IPAddress", cluster, "", []string{"ip"}},
	{"networking.k8s.io", "networkpolicies", "NetworkPolicy", namespaced, "", []string{"netpol"}},
	{"networking.k8s.io", "servicecidrs", "ServiceCIDR", cluster, "", nil},
	{"node.k8s.io", "runtimeclasses", "RuntimeClass", cluster, "", nil},
	{"policy", "poddisruptionbudgets", "PodDisruptionBudget", namespaced, "", []string{"pdb"}},
	{"rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", cluster, "", nil},
	{"rbac.authorization.k8s.io", "clusterroles", "ClusterRole", cluster, "", nil},
	{"rbac.authorization.k8s.io", "rolebindings", "RoleBinding", namespaced, "", nil},
	{"rbac.authorization.k8s.io", "roles", "Role", namespaced, "", nil},
	{"resource.k8s.io", "deviceclasses", "DeviceClass", cluster, "", nil},
	{"resource.k8s.io", "devicetaintrules", "DeviceTaintRule", cluster, "", nil},
	{"resource.k8s.io", "resourceclaims", "ResourceClaim", namespaced, "", nil},
	{"resource.k8s.io", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced, "", nil},
	{"resource.k8s.io", "resourcepoolstatusrequests", "ResourcePoolStatusRequest", cluster, "", nil},
	{"resource.k8s.io", "resourceslices", "ResourceSlice", cluster, "", nil},
	{"scheduling.k8s.io", "compositepodgroups", "CompositePodGroup", namespaced, "", nil},
	{"scheduling.k8s.io", "podgroups", "PodGroup", namespaced, "", nil},
	{"scheduling.k8s.io", "priorityclasses", "PriorityClass", cluster, "", []string{"pc"}},
	{"scheduling.k8s.io", "workloads", "Workload", namespaced, "", nil},
	{"storage.k8s.io", "csidrivers", "CSIDriver", cluster, "", nil},
	{"storage.k8s.io", "csinodes", "CSINode", cluster, "", nil},
	{"storage.k8s.io", "csistoragecapacities", "CSIStorageCapacity", namespaced, "", nil},
	{"storage.k8s.io", "storageclasses", "StorageClass", cluster, "", []string{"sc"}},
	{"storage.k8s.io", "volumeattachments", "VolumeAttachment", cluster, "", nil},
	{"storage.k8s.io", "volumeattributesclasses", "VolumeAttributesClass", cluster, "", []string{"vac"}},
	{"storagemigration.k8s.io", "storageversionmigrations", "StorageVersionMigration", cluster, "", nil},
}

// internalPaths are kube-apiserver's own records under the prefix: the
// API servers' endpoint leases and the allocation bitmaps of Service IPs
// and node ports. The API server rebuilds them; nothing applies them.
var internalPaths = map[string]string{
	"masterleases": "the API servers' endpoint leases (kube-apiserver --endpoint-reconciler-type=lease)",
	"ranges":       "kube-apiserver's allocation of Service cluster IPs and node ports",
}

func (b builtin) toResource() Resource {
	p := b.path
	if p == "" {
		p = b.resource
	}
	return Resource{
		Group: b.group, Resource: b.resource, Kind: b.kind, Singular: strings.ToLower(b.kind),
		ShortNames: b.short, Namespaced: b.namespaced, Path: p,
	}
}

// Catalog is every resource a snapshot's keys can belong to: the
// built-in ones, those its CustomResourceDefinitions define, and paths
// it holds that neither names.
type Catalog struct {
	byPath map[string]Resource
	all    []Resource
}

func newCatalog(custom []Resource, paths []string) *Catalog {
	c := &Catalog{byPath: map[string]Resource{}}
	add := func(r Resource) {
		if _, ok := c.byPath[r.Path]; ok {
			return
		}
		c.byPath[r.Path] = r
		c.all = append(c.all, r)
	}
	for _, b := range builtins {
		add(b.toResource())
	}
	for p := range internalPaths {
		add(Resource{Resource: p, Path: p, Internal: true})
	}
	for _, r := range custom {
		add(r)
	}
	for _, p := range paths {
		if _, ok := c.byPath[p]; !ok {
			add(unknownResource(p))
		}
	}
	return c
}

// unknownResource names a path no definition explains: "GROUP/PLURAL"
// (where custom resources live) or one segment (where built-ins do).
func unknownResource(path string) Resource {
	if group, plural, ok := strings.Cut(path, "/"); ok && strings.Contains(group, ".") {
		return Resource{Group: group, Resource: plural, Path: path, Unknown: true}
	}
	return Resource{Resource: path, Path: path, Unknown: true}
}

// ForPath returns the resource kept at path (under the prefix).
func (c *Catalog) ForPath(path string) Resource {
	if r, ok := c.byPath[path]; ok {
		return r
	}
	return unknownResource(path)
}

// Resources returns every resource of the catalog.
func (c *Catalog) Resources() []Resource { return append([]Resource(nil), c.all...) }

var versionLabel = regexp.MustCompile(`^v[0-9]+((alpha|beta)[0-9]+)?$`)

// Lookup finds the resource a kubectl-style name means: its plural,
// singular, kind or a short name ("configmaps", "configmap", "ConfigMap",
// "cm"), optionally qualified by its group ("deployments.apps",
// "deploy.apps", "deployments.v1.apps", "widgets.example.com"). Built-in
// resources come before custom ones of the same name, as kubectl's
// discovery orders them; two custom resources of the same name in
// different groups need the group. A "PLURAL.GROUP" that no definition
// explains still finds objects kept under GROUP/PLURAL.
func (c *Catalog) Lookup(name string) (Resource, error) {
	arg := name
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return Resource{}, fmt.Errorf("no resource named")
	}
	base, group, qualified := strings.Cut(name, ".")
	if qualified {
		if v, rest, ok := strings.Cut(group, "."); ok && versionLabel.MatchString(v) {
			group = rest
		} else if versionLabel.MatchString(group) {
			// "configmaps.v1": the core group at a version.
			group = ""
		}
	}
	matches := func(r Resource, short bool) bool {
		if r.Internal || (qualified && r.Group != group) {
			return false
		}
		if short {
			for _, s := range r.ShortNames {
				if s == base {
					return true
				}
			}
			return false
		}
		return r.Resource == base || r.Singular == base || strings.ToLower(r.Kind) == base
	}
	for _, short := range []bool{false, true} {
		var found []Resource
		for _, r := range c.all {
			if matches(r, short) {
				found = append(found, r)
			}
		}
		// Built-ins first, as kubectl's discovery orders them.
		var builtin []Resource
		for _, r := range found {
			if !r.Custom && !r.Unknown {
				builtin = append(builtin, r)
			}
		}
		if len(builtin) > 0 {
			found = builtin
		}
		switch {
		case len(found) == 1:
			return found[0], nil
		case len(found) > 1:
			var names []string
			for _, r := range found {
				names = append(names, r.String())
			}
			sort.Strings(names)
			return Resource{}, fmt.Errorf("%q is ambiguous in this backup: it names %s; give the one you mean", arg, strings.Join(names, ", "))
		}
	}
	if qualified && group != "" {
		// Custom resources whose definition the snapshot does not hold
		// (or holds encrypted) are still kept under GROUP/PLURAL.
		if r, ok := c.byPath[group+"/"+base]; ok {
			return r, nil
		}
	}
	if r, ok := c.byPath[base]; ok && r.Internal {
		return Resource{}, fmt.Errorf("%q is kube-apiserver's own record (%s), not an API resource: the API server rebuilds it", arg, internalPaths[base])
	}
	return Resource{}, &UnknownResourceError{Name: arg}
}

// UnknownResourceError is a name that no resource of the snapshot
// answers to.
type UnknownResourceError struct{ Name string }

func (e *UnknownResourceError) Error() string {
	return fmt.Sprintf("the backup has no resource type %q: not a built-in resource, nor one of its CustomResourceDefinitions (name a custom resource as PLURAL.GROUP)", e.Name)
}
