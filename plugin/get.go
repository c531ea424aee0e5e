package plugin

import (
	"context"
	"time"

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
		Use:     "get NAME",
		Aliases: []string{"describe"},
		Short:   "Show one backup",
		Example: examples(`
# Show one backup as a table row
kubectl etcdbackup get etcd-2026-01-31

# Show every field of the backup as YAML
kubectl etcdbackup get etcd-2026-01-31 -o yaml`),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(cmd, args); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.PrintFlags.AddFlags(cmd, "output format")
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *GetOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = args[0]
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
	resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: o.Location})
	if err != nil {
		return conn.explain("get backup "+quote(o.Name), err)
	}
	if o.PrintFlags.Structured() {
		return printMessage(o.Out, o.PrintFlags.OutputFormat, resp.GetBackup())
	}
	return printBackups(o.Out, o.PrintFlags.OutputFormat, &ebv1.ListBackupsResponse{Backups: []*ebv1.Backup{resp.GetBackup()}}, time.Now())
}
