package plugin

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// VerifyOptions are the options of `kubectl etcdbackup verify`.
type VerifyOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Name       string
}

// NewCmdVerify returns the verify command.
func NewCmdVerify(g *GlobalOptions) *cobra.Command {
	o := &VerifyOptions{GlobalOptions: g, PrintFlags: newPrintFlags(plainFormats)}
	cmd := &cobra.Command{
		Use:   "verify NAME",
		Short: "Check a stored backup end to end on the server, without downloading it",
		Long: `verify has the server re-read a backup and check its stored SHA-256, etcd's own
SHA-256 trailer and the consistency of the etcd database inside, then prints
the revision, key count and size etcd reports. A corrupt backup is an error.`,
		Example: examples(`
# Check a backup on the server: SHA-256, etcd's trailer and database
kubectl etcdbackup verify etcd-2026-01-31

# The same, with etcd's figures as JSON for a script
kubectl etcdbackup verify etcd-2026-01-31 -o json`),
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
func (o *VerifyOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = args[0]
	return nil
}

// Validate checks the flags.
func (o *VerifyOptions) Validate() error { return o.PrintFlags.Validate() }

// Run verifies the backup.
func (o *VerifyOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	r, err := conn.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: o.Name, Location: o.Location})
	if err != nil {
		return conn.explain("verify "+quote(o.Name), err)
	}
	if o.PrintFlags.Structured() {
		return printMessage(o.Out, o.PrintFlags.OutputFormat, r)
	}
	fmt.Fprintf(o.Out, "backup %q is intact: sha256 %s, etcd trailer and database consistent\n", o.Name, r.GetBackup().GetSha256())
	fmt.Fprintf(o.Out, "revision %d, %d keys, database %d bytes, etcd hash %d\n", r.GetRevision(), r.GetTotalKeys(), r.GetTotalSize(), r.GetHash())
	return nil
}
