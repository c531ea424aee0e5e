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
		Use:   "delete NAME [NAME...]",
		Short: "Delete backups",
		Example: examples(`
# Delete one backup from the server's default storage location
kubectl etcdbackup delete etcd-2026-01-31

# Delete two backups from location s3
kubectl etcdbackup delete etcd-2026-01-30 etcd-2026-01-31 --location s3`),
		Args: cobra.MinimumNArgs(1),
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
}

// Complete takes the backups' names from the arguments.
func (o *DeleteOptions) Complete(_ *cobra.Command, args []string) error {
	o.Names = args
	return nil
}

// Validate has nothing to check: the server owns the naming rules and
// says which name it refuses.
func (o *DeleteOptions) Validate() error { return nil }

// Run deletes each named backup, reporting each as it goes, and fails if
// any failed. Every failure is printed here, so the error returned is only
// the exit status.
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
	if failed != nil {
		return errAlreadyReported
	}
	return nil
}
