package plugin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tunnel"
)

// ExtractOptions are the options of `kubectl etcdbackup extract`.
type ExtractOptions struct {
	*GlobalOptions
	Name string
	// Resources are the resource types asked for (RESOURCE, or a comma
	// list of them); Objects the names, of a single resource.
	Resources []string
	Objects   []string
	// ObjectNamespace is --object-namespace; AllNamespaces -A. Neither:
	// the kubeconfig context's namespace, as kubectl's.
	ObjectNamespace string
	AllNamespaces   bool
	Selector        string
	// KeepOwnerReferences keeps metadata.ownerReferences (dropped by
	// default: see kube.ManifestOptions).
	KeepOwnerReferences bool
	Source              backupSource
	// Output is -o: Kubernetes objects, so cli-runtime's printers (json,
	// yaml, name, jsonpath, templates) rather than the plugin's tables.
	Output *genericclioptions.PrintFlags

	printer      printers.ResourcePrinter
	selector     labels.Selector
	serverNSFlag bool
}

// NewCmdExtract returns the extract command.
func NewCmdExtract(g *GlobalOptions) *cobra.Command {
	o := &ExtractOptions{GlobalOptions: g, Output: genericclioptions.NewPrintFlags("").WithDefaultOutput("yaml")}
	cmd := &cobra.Command{
		Use:   "extract NAME RESOURCE[,RESOURCE...] [OBJECT...]",
		Short: "Print objects from a backup as manifests to apply again, without rolling the cluster back",
		Long: `extract prints Kubernetes objects as they were in a backup, ready for
"kubectl apply -f -" or "kubectl create -f -": the way to recover a deleted
or broken object without restoring the whole of etcd. THE OUTPUT CONTAINS
SECRET DATA when Secrets are asked for (that is the point of recovering one):
print it to a pipe or to a file only you can read.

The backup is downloaded into a temporary file and checked exactly as
download checks it (--identity decrypts an encrypted one), etcd's database
is opened read-only, and the latest revision of each object is decoded from
the API server's storage encoding: protobuf for built-in types (decoded with
client-go's types), JSON or CBOR for custom resources. Nothing is sent to
the cluster. With --storage-config the backup is read from its storage
location without the API server; with --from-file FILE (a snapshot written
by download) no server is asked. The temporary file is removed at the end.

RESOURCE takes kubectl's names: plural, singular, kind or short name,
optionally with the group ("configmaps", "cm", "deployments.apps", "deploy",
"widgets.example.com"); custom resources are resolved with the
CustomResourceDefinitions in the backup itself; several types go in a comma
list. OBJECT names limit the output to those objects (of one RESOURCE).

Namespaces: -n/--namespace is, as for every command of this plugin, the
namespace the etcdbackup server runs in, not the objects'. The objects'
namespace is --object-namespace NS, or -A for every namespace; without
either it is your kubeconfig context's namespace, as for kubectl.

What is printed is each object as stored, less what the API server sets:
metadata.resourceVersion, uid, creationTimestamp, managedFields,
generation, selfLink, deletionTimestamp and deletionGracePeriodSeconds are
removed, and status wherever the API server ignores it on create and apply
(built-in types, custom resources with a status subresource; a custom
resource without one keeps it, as data). metadata.ownerReferences name
owners by UID: an object whose owners are all gone (or were re-created, with
new UIDs) would be deleted again by the garbage collector. Online (through
the etcdbackup server) each reference is checked against the cluster of
your kubeconfig: kept when an object of that kind and name exists there with
the same UID (the recovered object is again its dependent, as it was),
removed otherwise. With --storage-config or --from-file the cluster is not
asked, and every ownerReference is removed (said on stderr).
--keep-owner-references keeps them all unchecked. Labels, annotations
(kubectl's last-applied-configuration too), finalizers, spec and data are
kept as they were; so are fields a controller filled in, such as a
Service's clusterIP (a new Service gets the same IP if it is still free).
Objects that controllers make (Pods of a ReplicaSet, ReplicaSets of a
Deployment, EndpointSlices) are better recreated by restoring their owner.

Objects the API server encrypted at rest (EncryptionConfiguration: values
starting "k8s:enc:") are read with --encryption-config FILE, the API
server's EncryptionConfiguration as it was when the backup was taken: its
aescbc, aesgcm and secretbox keys open them, offline. KMS providers keep
their keys in the KMS, so their objects cannot be opened here. Without the
file, or without the key, each is named on stderr with its provider and key
(and why it did not open), and skipped. So is an object of a type this
build cannot decode.

Exit codes: 0 when every object asked for was printed; 3 when a named OBJECT
is not in the backup; 6 when objects were skipped (encrypted, undecodable),
after printing the others.`,
		Example: examples(`
# Put back the ConfigMap app-config of namespace shop as it was in a backup
kubectl etcdbackup extract etcd-2026-01-31 configmap app-config --object-namespace shop | kubectl apply -f -

# Recover a deleted Secret (the output holds its data)
kubectl etcdbackup extract etcd-2026-01-31 secret db-password --object-namespace shop | kubectl create -f -

# The same Secret, encrypted at rest by the API server
kubectl etcdbackup extract etcd-2026-01-31 secret db-password --object-namespace shop \
  --encryption-config /etc/kubernetes/enc/encryption-config.yaml | kubectl create -f -

# Every Deployment, ConfigMap and Secret of namespace shop labelled app=web
kubectl etcdbackup extract etcd-2026-01-31 deployments,configmaps,secrets --object-namespace shop -l app=web > shop.yaml

# A custom resource, named by its CustomResourceDefinition in the backup
kubectl etcdbackup extract etcd-2026-01-31 certificates.cert-manager.io -A -o json

# Only list what a backup holds of a resource, as kind/name
kubectl etcdbackup extract etcd-2026-01-31 cm -A -o name

# From a snapshot downloaded earlier, with the control plane down
kubectl etcdbackup extract snapshot configmaps --from-file /tmp/snapshot.db --object-namespace shop`),
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	f := cmd.Flags()
	f.StringVarP(o.Output.OutputFormat, "output", "o", *o.Output.OutputFormat, "output format: "+orList(o.Output.AllowedFormats()))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return o.Output.AllowedFormats(), cobra.ShellCompDirectiveNoFileComp
	})
	f.StringVar(&o.ObjectNamespace, "object-namespace", "", "the namespace of the objects to extract (default: the kubeconfig context's namespace); -n is the etcdbackup server's namespace, as for every command")
	f.BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "extract the objects of every namespace")
	f.StringVarP(&o.Selector, "selector", "l", "", "only objects whose labels match this selector (e.g. app=web,tier!=db)")
	f.BoolVar(&o.KeepOwnerReferences, "keep-owner-references", false, "keep every metadata.ownerReferences unchecked (by default online each is kept only when its owner exists in the cluster with the same UID, and offline all are removed)")
	o.Source.addFlags(cmd, g)
	return cmd
}

// Complete takes the backup's name, the resource types and the object
// names from the arguments.
func (o *ExtractOptions) Complete(cmd *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	o.Resources = nil
	for _, r := range strings.Split(args[1], ",") {
		if r = strings.TrimSpace(r); r != "" {
			o.Resources = append(o.Resources, r)
		}
	}
	o.Objects = args[2:]
	o.serverNSFlag = cmd.Flags().Changed("namespace")
	return nil
}

// Validate checks that the flags go together and parses the selector
// and the output format.
func (o *ExtractOptions) Validate() error {
	switch {
	case len(o.Resources) == 0:
		return errors.New("name the resource type to extract, e.g. configmaps or deployments.apps")
	case len(o.Objects) > 0 && len(o.Resources) > 1:
		return fmt.Errorf("object names go with one resource type, not %d (%s)", len(o.Resources), strings.Join(o.Resources, ","))
	case o.AllNamespaces && o.ObjectNamespace != "":
		return errors.New("give --object-namespace or -A, not both")
	case o.AllNamespaces && len(o.Objects) > 0:
		return errors.New("objects are named within one namespace: drop -A, and give --object-namespace if it is not your context's")
	case len(o.Objects) > 0 && o.Selector != "":
		return errors.New("name objects or select them with -l, not both")
	case o.serverNSFlag && o.GlobalOptions != nil && (o.Source.FromFile != "" || o.StorageConfig != ""):
		return errors.New("-n is the namespace the etcdbackup server runs in, which --from-file and --storage-config do not use; the objects' namespace is --object-namespace NS (or -A for all)")
	}
	if err := o.Source.validate(o.GlobalOptions); err != nil {
		return err
	}
	if o.Selector != "" {
		sel, err := labels.Parse(o.Selector)
		if err != nil {
			return fmt.Errorf("-l %q: %w", o.Selector, err)
		}
		o.selector = sel
	}
	p, err := o.Output.ToPrinter()
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		return fmt.Errorf("-o %q is not a known output format; use one of %s", *o.Output.OutputFormat, strings.Join(o.Output.AllowedFormats(), ", "))
	}
	if err != nil {
		return fmt.Errorf("-o %s: %w", *o.Output.OutputFormat, err)
	}
	o.printer = p
	return nil
}

// contextNamespace is the kubeconfig context's namespace ("default"
// without one), read without -n, which names the server's namespace.
func (o *ExtractOptions) contextNamespace() (string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	overrides := &clientcmd.ConfigOverrides{}
	if cf := o.ConfigFlags; cf != nil {
		if cf.KubeConfig != nil && *cf.KubeConfig != "" {
			rules.ExplicitPath = *cf.KubeConfig
		}
		if cf.Context != nil {
			overrides.CurrentContext = *cf.Context
		}
	}
	ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).Namespace()
	if err != nil {
		return "", fmt.Errorf("the objects' namespace is the kubeconfig context's when --object-namespace and -A are not given, and the kubeconfig cannot be read: %w", err)
	}
	return ns, nil
}

// Run reads the backup and prints the objects.
func (o *ExtractOptions) Run(ctx context.Context) error {
	b, err := o.Source.open(ctx, o.GlobalOptions, "extract", o.Name)
	if err != nil {
		var notInstalled *tunnel.NotInstalledError
		if o.serverNSFlag && errors.As(err, &notInstalled) {
			return fmt.Errorf("%w\n(-n is the namespace the etcdbackup server runs in, as for every command of this plugin; the namespace of the objects to extract is --object-namespace)", err)
		}
		return err
	}
	defer b.Close()
	for _, err := range b.CatalogErrors {
		fmt.Fprintf(o.ErrOut, "Warning: %v; name its custom resources as PLURAL.GROUP\n", err)
	}
	var resources []kube.Resource
	namespaced := false
	for _, name := range o.Resources {
		r, err := b.Catalog.Lookup(name)
		if err != nil {
			return fmt.Errorf("extract from %q: %w", o.Name, err)
		}
		resources = append(resources, r)
		namespaced = namespaced || r.Namespaced
	}
	ns := o.ObjectNamespace
	if namespaced && ns == "" && !o.AllNamespaces {
		if ns, err = o.contextNamespace(); err != nil {
			return err
		}
	}

	x := &extraction{offline: o.Source.FromFile != "" || o.StorageConfig != ""}
	if !o.KeepOwnerReferences && !x.offline {
		if x.owners, err = newOwnerChecker(o.GlobalOptions); err != nil {
			x.ownersErr = err
		}
	}
	if err := o.extract(ctx, x, b, resources, ns); err != nil {
		return err
	}
	where := "every namespace"
	if ns != "" {
		where = "namespace " + quote(ns)
	}
	if !namespaced {
		where = "the cluster"
	}
	o.report(x, fmt.Sprintf("%s of backup %q (revision %d)", where, o.Name, b.Status.Revision))
	if err := o.printer.PrintObj(x.output(len(o.Objects) == 1), o.Out); err != nil {
		return err
	}
	switch {
	case len(x.missing) > 0:
		return withCode(ExitNotFound, fmt.Errorf("not in backup %q (%s): %s", o.Name, where, strings.Join(x.missing, ", ")))
	case len(x.skipped) > 0:
		return withCode(ExitIncomplete, fmt.Errorf("%d %s could not be extracted (see the warnings above); the others were printed", len(x.skipped), plural(int64(len(x.skipped)), "object", "objects")))
	}
	return nil
}

// extraction is what extract found: the manifests, the objects it could
// not read, the names asked for that are not there, and what Manifest
// removed that is worth saying.
type extraction struct {
	objects                  []*unstructured.Unstructured
	skipped                  []error
	missing, owned, deleting []string
	// offline: the backup was read without the server (--from-file,
	// --storage-config), and the cluster is not asked about owners.
	offline bool
	// owners checks ownerReferences against the cluster (online, without
	// --keep-owner-references); ownersErr says why it could not be made.
	owners    *ownerChecker
	ownersErr error
	// ownedKept have every ownerReference kept, their owners existing;
	// orphaned lost some whose owners are gone; unchecked lost some
	// whose owners could not be looked up (uncheckedErr, the first).
	ownedKept, orphaned, unchecked []string
	uncheckedErr                   error
}

// extract walks each resource's selected objects and makes them
// manifests into x.
func (o *ExtractOptions) extract(ctx context.Context, x *extraction, b *openedBackup, resources []kube.Resource, ns string) error {
	for _, r := range resources {
		found := map[string]bool{}
		err := b.Objects(kube.Selection{Resource: r, Namespace: ns, Names: o.Objects, Labels: o.selector}, func(obj kube.Object, err error) error {
			found[obj.Name] = true
			if err != nil {
				x.skipped = append(x.skipped, err)
				return nil
			}
			d := kube.Manifest(obj.Object, r, kube.ManifestOptions{KeepOwnerReferences: o.KeepOwnerReferences || x.owners != nil})
			label := r.String() + " " + quote(objectPath(obj))
			if len(d.OwnerReferences) > 0 {
				x.owned = append(x.owned, label+" (owned by "+strings.Join(d.OwnerReferences, ", ")+")")
			}
			if x.owners != nil {
				x.checkOwners(ctx, obj.Object, label)
			}
			if d.Deleting {
				x.deleting = append(x.deleting, label)
			}
			x.objects = append(x.objects, obj.Object)
			return nil
		})
		if err != nil {
			return fmt.Errorf("extract from %q: %w", o.Name, err)
		}
		for _, n := range o.Objects {
			if !found[n] {
				x.missing = append(x.missing, r.String()+" "+quote(n))
			}
		}
	}
	return nil
}

// checkOwners keeps the ownerReferences of u whose owners exist in the
// cluster with the same UIDs and removes the others.
func (x *extraction) checkOwners(ctx context.Context, u *unstructured.Unstructured, label string) {
	refs := u.GetOwnerReferences()
	if len(refs) == 0 {
		return
	}
	var kept []metav1.OwnerReference
	var gone, failed []string
	for _, ref := range refs {
		ok, err := x.owners.exists(ctx, u.GetNamespace(), ref)
		switch {
		case err != nil:
			failed = append(failed, ref.Kind+"/"+ref.Name)
			if x.uncheckedErr == nil {
				x.uncheckedErr = err
			}
		case ok:
			kept = append(kept, ref)
		default:
			gone = append(gone, ref.Kind+"/"+ref.Name)
		}
	}
	if len(kept) == len(refs) {
		x.ownedKept = append(x.ownedKept, label)
		return
	}
	if len(kept) == 0 {
		unstructured.RemoveNestedField(u.Object, "metadata", "ownerReferences")
	} else {
		u.SetOwnerReferences(kept)
	}
	if len(gone) > 0 {
		x.orphaned = append(x.orphaned, label+" (owned by "+strings.Join(gone, ", ")+")")
	}
	if len(failed) > 0 {
		x.unchecked = append(x.unchecked, label+" (owned by "+strings.Join(failed, ", ")+")")
	}
}

// report says on stderr what was skipped or changed, and what was found
// where.
func (o *ExtractOptions) report(x *extraction, where string) {
	for _, err := range x.skipped {
		fmt.Fprintf(o.ErrOut, "Warning: %v; skipped\n", err)
	}
	for _, d := range x.deleting {
		fmt.Fprintf(o.ErrOut, "Warning: %s was being deleted when the backup was taken (it had a deletionTimestamp, removed here)\n", d)
	}
	objects := func(s []string) string {
		return fmt.Sprintf("%d %s", len(s), plural(int64(len(s)), "object", "objects"))
	}
	switch {
	case o.KeepOwnerReferences:
	case x.owners != nil:
		if len(x.ownedKept) > 0 {
			fmt.Fprintf(o.ErrOut, "ownerReferences kept on %s, whose owners exist in the cluster with the same UIDs: %s\n", objects(x.ownedKept), listSome(x.ownedKept, 5))
		}
		if len(x.orphaned) > 0 {
			fmt.Fprintf(o.ErrOut, "ownerReferences removed from %s, whose owners no longer exist in the cluster (or were re-created, with other UIDs): %s\n",
				objects(x.orphaned), listSome(x.orphaned, 5))
		}
		if len(x.unchecked) > 0 {
			fmt.Fprintf(o.ErrOut, "Warning: ownerReferences removed from %s, whose owners could not be looked up (%v; pass --keep-owner-references if they exist with those UIDs): %s\n",
				objects(x.unchecked), x.uncheckedErr, listSome(x.unchecked, 5))
		}
	case len(x.owned) == 0:
	case x.offline:
		fmt.Fprintf(o.ErrOut, "ownerReferences removed from %s: read offline (--from-file, --storage-config), the cluster is not asked whether their owners still exist with those UIDs (pass --keep-owner-references if they do): %s\n",
			objects(x.owned), listSome(x.owned, 5))
	default:
		fmt.Fprintf(o.ErrOut, "Warning: ownerReferences removed from %s: the cluster could not be asked whether their owners still exist (%v; pass --keep-owner-references if they do): %s\n",
			objects(x.owned), x.ownersErr, listSome(x.owned, 5))
	}
	if len(x.objects) == 0 && len(x.skipped) == 0 && len(x.missing) == 0 {
		fmt.Fprintf(o.ErrOut, "No %s found in %s.\n", strings.Join(o.Resources, ","), where)
		return
	}
	fmt.Fprintf(o.ErrOut, "%d %s from %s\n", len(x.objects), plural(int64(len(x.objects)), "object", "objects"), where)
}

// output is what -o prints: the one object asked for by name, or a List
// (kubectl's, which apply and create take).
func (x *extraction) output(oneNamed bool) runtime.Object {
	if oneNamed && len(x.objects) == 1 {
		return x.objects[0]
	}
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List"}, Items: []unstructured.Unstructured{}}
	for _, u := range x.objects {
		list.Items = append(list.Items, *u)
	}
	return list
}

func objectPath(o kube.Object) string {
	if o.Namespace == "" {
		return o.Name
	}
	return o.Namespace + "/" + o.Name
}

// listSome joins the first n of s, saying how many more there are.
func listSome(s []string, n int) string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(s[:n], ", "), len(s)-n)
}
