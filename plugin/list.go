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
	Output   string
	Selector string
}

// NewCmdList returns the list command.
func NewCmdList(g *GlobalOptions) *cobra.Command {
	o := &ListOptions{GlobalOptions: g, Output: "table"}
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the backups in a storage location",
		Example: `  kubectl etcdbackup list
  kubectl etcdbackup list -o wide --location s3
  kubectl etcdbackup list -l env=prod -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "output format: table, wide, json or yaml")
	cmd.Flags().StringVarP(&o.Selector, "selector", "l", "", "label selector to filter backups (e.g. env=prod)")
	return cmd
}

// Validate checks the flags.
func (o *ListOptions) Validate() error { return validateOutput(o.Output) }

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
	if len(resp.GetBackups()) == 0 && (o.Output == "table" || o.Output == "wide") {
		_, err := o.ErrOut.Write([]byte("No backups found.\n"))
		return err
	}
	return printBackups(o.Out, o.Output, resp, time.Now())
}
