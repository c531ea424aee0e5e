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
	Name   string
	Output string
}

// NewCmdGet returns the get command.
func NewCmdGet(g *GlobalOptions) *cobra.Command {
	o := &GetOptions{GlobalOptions: g, Output: "table"}
	cmd := &cobra.Command{
		Use:     "get NAME",
		Aliases: []string{"describe"},
		Short:   "Show one backup",
		Example: `  kubectl etcdbackup get etcd-2026-01-31
  kubectl etcdbackup get etcd-2026-01-31 -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "output format: table, wide, json or yaml")
	return cmd
}

// Validate checks the flags.
func (o *GetOptions) Validate() error { return validateOutput(o.Output) }

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
	if o.Output == "json" || o.Output == "yaml" {
		return printMessage(o.Out, o.Output, resp.GetBackup())
	}
	return printBackups(o.Out, o.Output, &ebv1.ListBackupsResponse{Backups: []*ebv1.Backup{resp.GetBackup()}}, time.Now())
}
