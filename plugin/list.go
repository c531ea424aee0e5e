package plugin

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// ListOptions are the options of `kubectl etcdbackup list`.
type ListOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Selector   string
}

// NewCmdList returns the list command.
func NewCmdList(g *GlobalOptions) *cobra.Command {
	o := &ListOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats)}
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the backups in a storage location",
		Example: examples(`
# List the backups in the server's default storage location
kubectl etcdbackup list

# List the backups in location s3, with source, revision, compression, SHA-256 and labels
kubectl etcdbackup list -o wide --location s3

# List the backups labelled env=prod as JSON
kubectl etcdbackup list -l env=prod -o json`),
		Args: cobra.NoArgs,
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
	cmd.Flags().StringVarP(&o.Selector, "selector", "l", "", "label selector to filter backups (e.g. env=prod)")
	return cmd
}

// Complete has nothing to fill in: every field comes from a flag.
func (o *ListOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the flags.
func (o *ListOptions) Validate() error { return o.PrintFlags.Validate() }

// Run lists the backups.
func (o *ListOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := conn.Backups.ListBackups(ctx, &ebv1.ListBackupsRequest{Location: o.Location, LabelSelector: o.Selector})
	if err != nil {
		return conn.explain("list backups", err)
	}
	if len(resp.GetBackups()) == 0 && !o.PrintFlags.Structured() {
		_, err := o.ErrOut.Write([]byte("No backups found.\n"))
		return err
	}
	return printBackups(o.Out, o.PrintFlags.OutputFormat, resp, time.Now())
}
