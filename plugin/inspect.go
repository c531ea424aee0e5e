package plugin

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube"
)

// InspectOptions are the options of `kubectl etcdbackup inspect`.
type InspectOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Name       string
	Source     backupSource
}

// NewCmdInspect returns the inspect command.
func NewCmdInspect(g *GlobalOptions) *cobra.Command {
	o := &InspectOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats)}
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show the Kubernetes objects in a backup: how many, how large, per resource and namespace",
		Long: `inspect reads the Kubernetes API server's objects in a backup of its etcd,
without an API server: the backup is downloaded into a temporary file and
checked exactly as download checks it (--identity decrypts an encrypted one;
etcd's trailer and the SHA-256s are verified), then etcd's database is
opened read-only and the latest revision of every key under /registry is
counted by resource and namespace, as kube-apiserver lays them out. Nothing
is decoded or decrypted: sizes are the stored values' (protobuf or JSON, or
ciphertext for what the API server encrypts at rest, counted as ENCRYPTED).

Custom resources are named by the CustomResourceDefinitions in the backup;
kube-apiserver's own records (/registry/masterleases/, /registry/ranges/)
are listed by their path, after the resources. -o wide lists each resource
per namespace. Stderr says the snapshot's revision, etcd's key count and the
keys outside /registry.

With --storage-config the backup is read from its storage location without
the API server; with --from-file FILE (a snapshot written by download) no
server is asked and NAME is only a label. The temporary file is removed when
inspect ends.`,
		Example: examples(`
# Count the objects in a backup per resource
kubectl etcdbackup inspect etcd-2026-01-31

# The same per namespace and resource
kubectl etcdbackup inspect etcd-2026-01-31 -o wide

# How many Secrets the backup holds, in a script
kubectl etcdbackup inspect etcd-2026-01-31 -o jsonpath='{.status.resources[?(@.resource=="secrets")].objects}'

# A snapshot downloaded earlier, with the control plane down
kubectl etcdbackup inspect snapshot --from-file /tmp/snapshot.db`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	o.PrintFlags.AddFlags(cmd, "output format")
	o.Source.addFlags(cmd, g)
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *InspectOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	return nil
}

// Validate checks the flags.
func (o *InspectOptions) Validate() error {
	if err := o.Source.validate(o.GlobalOptions); err != nil {
		return err
	}
	return o.PrintFlags.Validate()
}

// Run reads the backup and prints what it holds.
func (o *InspectOptions) Run(ctx context.Context) error {
	b, err := o.Source.open(ctx, o.GlobalOptions, "inspect", o.Name)
	if err != nil {
		return err
	}
	defer b.Close()
	for _, err := range b.CatalogErrors {
		fmt.Fprintf(o.ErrOut, "Warning: %v; its custom resources are listed by their path\n", err)
	}
	c := b.Contents(b.Catalog)
	doc := o.contentsObject(b, c)
	fmt.Fprintln(o.ErrOut, contentsSummary(doc))
	if o.PrintFlags.Human() && len(doc.Status.Resources) == 0 {
		fmt.Fprintf(o.ErrOut, "No Kubernetes objects found under %s.\n", doc.Spec.EtcdPrefix)
		return nil
	}
	return o.PrintFlags.Print(o.Out, doc, func(w io.Writer) error {
		return printContentsTable(w, doc, o.PrintFlags.Wide(), o.PrintFlags.NoHeaders)
	})
}

// BackupContents is what `inspect -o json|yaml` prints: the Kubernetes
// objects a backup holds, counted.
type BackupContents struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        ObjectMeta           `json:"metadata"`
	Spec            BackupContentsSpec   `json:"spec"`
	Status          BackupContentsStatus `json:"status"`
}

// BackupContentsSpec says what was read.
type BackupContentsSpec struct {
	// Location is the backup's storage location; File, with --from-file,
	// the file read instead.
	Location string `json:"location,omitempty"`
	File     string `json:"file,omitempty"`
	// EtcdPrefix is the prefix counted under (kube-apiserver's
	// --etcd-prefix), with its trailing slash.
	EtcdPrefix string `json:"etcdPrefix"`
}

// BackupContentsStatus are the counts.
type BackupContentsStatus struct {
	// Revision and TotalKeys are etcd's own figures of the snapshot
	// (etcdutl snapshot status): its newest revision and its live keys,
	// Objects and OtherKeys together.
	Revision  int64 `json:"revision"`
	TotalKeys int64 `json:"totalKeys"`
	// ObjectCount counts the live keys under the prefix (the latest
	// revision of each, deleted ones left out).
	ObjectCount
	// OtherKeys are the live keys outside the prefix.
	OtherKeys      int64 `json:"otherKeys"`
	OtherSizeBytes int64 `json:"otherSizeBytes"`
	// Resources count each resource's objects, built-in and custom by
	// name, kube-apiserver's own records last.
	Resources []ResourceContents `json:"resources"`
	// Warnings name the CustomResourceDefinitions that could not be read.
	Warnings []string `json:"warnings,omitempty"`
}

// ResourceContents counts one resource's objects.
type ResourceContents struct {
	// Resource and Group name it as the API does; Kind when known.
	Resource   string `json:"resource"`
	Group      string `json:"group,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Namespaced bool   `json:"namespaced"`
	// Custom: defined by a CustomResourceDefinition in the backup.
	// Internal: kube-apiserver's own record, not API objects. Unknown: a
	// path no definition explains, named after it.
	Custom   bool `json:"custom,omitempty"`
	Internal bool `json:"internal,omitempty"`
	Unknown  bool `json:"unknown,omitempty"`
	// EtcdPath is where its objects are kept.
	EtcdPath string `json:"etcdPath"`
	ObjectCount
	// EncryptedBy counts the encrypted objects by the provider and key
	// of the API server's EncryptionConfiguration that encrypted them.
	EncryptedBy []EncryptionCount   `json:"encryptedBy,omitempty"`
	Namespaces  []NamespaceContents `json:"namespaces,omitempty"`
}

// NamespaceContents counts a resource's objects in one namespace.
type NamespaceContents struct {
	Namespace string `json:"namespace"`
	ObjectCount
}

// ObjectCount is a number of objects (JSON: inline), their stored
// values' size, and how many of them the API server encrypted at rest.
type ObjectCount struct {
	Objects   int64 `json:"objects"`
	SizeBytes int64 `json:"sizeBytes"`
	Encrypted int64 `json:"encrypted"`
}

// EncryptionCount is how many objects one provider's key encrypted.
type EncryptionCount struct {
	// Provider is aescbc, aesgcm, secretbox or kms; Key the key's name
	// (the plugin's, for kms).
	Provider string `json:"provider"`
	Version  string `json:"version,omitempty"`
	Key      string `json:"key,omitempty"`
	Objects  int64  `json:"objects"`
}

func countOf(c kube.Count) ObjectCount {
	return ObjectCount{Objects: int64(c.Objects), SizeBytes: c.Bytes, Encrypted: int64(c.Encrypted)}
}

func (c *BackupContents) DeepCopyObject() runtime.Object { d := *c; return &d }

var _ runtime.Object = &BackupContents{}

func (o *InspectOptions) contentsObject(b *openedBackup, c *kube.Contents) *BackupContents {
	doc := &BackupContents{
		TypeMeta: typeMeta("BackupContents"),
		Metadata: ObjectMeta{Name: o.Name},
		Spec:     BackupContentsSpec{File: o.Source.FromFile, EtcdPrefix: c.Prefix},
		Status: BackupContentsStatus{
			Revision: b.Status.Revision, TotalKeys: int64(b.Status.TotalKey),
			ObjectCount: countOf(c.Count),
			OtherKeys:   int64(c.OtherKeys), OtherSizeBytes: c.OtherBytes,
			Resources: []ResourceContents{},
		},
	}
	if b.Backup != nil {
		doc.Spec.Location = b.Backup.GetLocation()
	}
	for _, err := range b.CatalogErrors {
		doc.Status.Warnings = append(doc.Status.Warnings, err.Error())
	}
	for _, rc := range c.Resources {
		r := rc.Resource
		out := ResourceContents{
			Resource: r.Resource, Group: r.Group, Kind: r.Kind, Namespaced: r.Namespaced,
			Custom: r.Custom, Internal: r.Internal, Unknown: r.Unknown, EtcdPath: c.Prefix + r.Path + "/",
			ObjectCount: countOf(rc.Count),
		}
		for e, n := range rc.EncryptedBy {
			out.EncryptedBy = append(out.EncryptedBy, EncryptionCount{Provider: e.Provider, Version: e.Version, Key: e.Key, Objects: int64(n)})
		}
		slices.SortFunc(out.EncryptedBy, func(a, b EncryptionCount) int {
			return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.Key, b.Key), cmp.Compare(a.Version, b.Version))
		})
		for _, n := range rc.Namespaces {
			out.Namespaces = append(out.Namespaces, NamespaceContents{Namespace: n.Namespace, ObjectCount: countOf(n.Count)})
		}
		doc.Status.Resources = append(doc.Status.Resources, out)
	}
	return doc
}

// contentsSummary is the line inspect writes on stderr.
func contentsSummary(doc *BackupContents) string {
	s := doc.Status
	what := fmt.Sprintf("backup %q", doc.Metadata.Name)
	if doc.Spec.File != "" {
		what = doc.Spec.File
	}
	line := fmt.Sprintf("%s: etcd revision %d, %d keys; %d objects under %s (%s)",
		what, s.Revision, s.TotalKeys, s.Objects, doc.Spec.EtcdPrefix, humanize.IBytes(uint64(s.SizeBytes)))
	if s.Encrypted > 0 {
		var by []string
		for _, r := range s.Resources {
			for _, e := range r.EncryptedBy {
				by = append(by, fmt.Sprintf("%d %s by %s", e.Objects, r.Resource, kube.Encryption{Provider: e.Provider, Version: e.Version, Key: e.Key}))
			}
		}
		line += fmt.Sprintf(", %d of them encrypted at rest (%s)", s.Encrypted, strings.Join(by, "; "))
	}
	line += fmt.Sprintf("; %d %s outside it", s.OtherKeys, plural(s.OtherKeys, "key", "keys"))
	if s.Objects == 0 && s.OtherKeys > 0 {
		line += fmt.Sprintf(": this etcd holds no Kubernetes objects under %s (another --etcd-prefix?)", doc.Spec.EtcdPrefix)
	}
	return line
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

var (
	contentsColumns = []metav1.TableColumnDefinition{
		{Name: "Resource", Type: "string"},
		{Name: "Objects", Type: "integer"},
		{Name: "Size", Type: "string"},
		{Name: "Encrypted", Type: "integer"},
		{Name: "Namespaces", Type: "integer"},
	}
	contentsWideColumns = []metav1.TableColumnDefinition{
		{Name: "Namespace", Type: "string"},
		{Name: "Resource", Type: "string"},
		{Name: "Objects", Type: "integer"},
		{Name: "Size", Type: "string"},
		{Name: "Encrypted", Type: "integer"},
	}
)

// resourceLabel is a resource as the table names it: kubectl's
// RESOURCE.GROUP, or the etcd path of kube-apiserver's own records.
func resourceLabel(r ResourceContents) string {
	switch {
	case r.Internal:
		return r.EtcdPath
	case r.Group == "":
		return r.Resource
	}
	return r.Resource + "." + r.Group
}

// printContentsTable writes one row per resource, or with wide one per
// resource and namespace (cluster-scoped ones in <none>), sorted by
// namespace.
func printContentsTable(w io.Writer, doc *BackupContents, wide, noHeaders bool) error {
	table := &metav1.Table{ColumnDefinitions: contentsColumns}
	if !wide {
		for _, r := range doc.Status.Resources {
			ns := any(int64(len(r.Namespaces)))
			if !r.Namespaced {
				ns = "<none>"
			}
			table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{resourceLabel(r), r.Objects, humanize.IBytes(uint64(r.SizeBytes)), r.Encrypted, ns}})
		}
	} else {
		table.ColumnDefinitions = contentsWideColumns
		type row struct {
			ns    string
			cells []any
		}
		var rows []row
		for _, r := range doc.Status.Resources {
			if len(r.Namespaces) == 0 {
				rows = append(rows, row{"", []any{"<none>", resourceLabel(r), r.Objects, humanize.IBytes(uint64(r.SizeBytes)), r.Encrypted}})
				continue
			}
			for _, n := range r.Namespaces {
				rows = append(rows, row{n.Namespace, []any{n.Namespace, resourceLabel(r), n.Objects, humanize.IBytes(uint64(n.SizeBytes)), n.Encrypted}})
			}
		}
		// Namespaces in order, cluster-scoped rows first; within one, the
		// resources' own order.
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].ns < rows[j].ns })
		for _, r := range rows {
			table.Rows = append(table.Rows, metav1.TableRow{Cells: r.cells})
		}
	}
	return printers.NewTablePrinter(printers.PrintOptions{NoHeaders: noHeaders}).PrintObj(table, w)
}
