package plugin

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// DeleteOptions are the options of `kubectl etcdbackup delete`.
type DeleteOptions struct {
	*GlobalOptions
	Names []string
}

// NewCmdDelete returns the delete command.
func NewCmdDelete(g *GlobalOptions) *cobra.Command {
	o := &DeleteOptions{GlobalOptions: g}
	return &cobra.Command{
		Use:     "delete NAME [NAME...]",
		Short:   "Delete backups",
		Example: `  kubectl etcdbackup delete etcd-2026-01-31`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Names = args
			return o.Run(cmd.Context())
		},
	}
}

// Run deletes each named backup, reporting each, and fails if any failed.
func (o *DeleteOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var failed error
	for _, name := range o.Names {
		if _, err := conn.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: name, Location: o.Location}); err != nil {
			err = conn.explain("delete backup "+quote(name), err)
			fmt.Fprintf(o.ErrOut, "error: %v\n", err)
			failed = err
			continue
		}
		fmt.Fprintf(o.Out, "backup %q deleted\n", name)
	}
	if failed != nil && len(o.Names) > 1 {
		return errAlreadyReported
	}
	return failed
}
