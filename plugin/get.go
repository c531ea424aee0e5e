package plugin

import (
	"context"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// GetOptions are the options of `kubectl etcdbackup get`.
type GetOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Name       string
}

// NewCmdGet returns the get command.
func NewCmdGet(g *GlobalOptions) *cobra.Command {
	o := &GetOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats)}
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one backup, from whichever storage location holds it",
		Example: examples(`
# Show one backup as a table row
kubectl etcdbackup get etcd-2026-01-31

# Show every field of the backup as a Kubernetes-style YAML document
kubectl etcdbackup get etcd-2026-01-31 -o yaml

# Print the backup's size in bytes
kubectl etcdbackup get etcd-2026-01-31 -o jsonpath='{.status.sizeBytes}'`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	o.PrintFlags.AddFlags(cmd, "output format")
	addStorageConfigFlag(cmd, g)
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *GetOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	return nil
}

// Validate checks the flags.
func (o *GetOptions) Validate() error { return o.PrintFlags.Validate() }

// Run shows the backup.
func (o *GetOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	b, err := o.findBackup(ctx, conn, "get backup "+quote(o.Name), o.Name)
	if err != nil {
		return err
	}
	return printBackups(o.Out, o.PrintFlags, []*ebv1.Backup{b}, true)
}
