package plugin

import (
	"context"
	"fmt"
	"io"

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
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(cmd, args); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return usageError(err)
			}
			return o.Run(cmd.Context())
		},
	}
	o.PrintFlags.AddFlags(cmd, "output format")
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *VerifyOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
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
	location, err := o.resolveLocation(ctx, conn, "verify "+quote(o.Name), o.Name)
	if err != nil {
		return err
	}
	r, err := conn.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: o.Name, Location: location})
	if err != nil {
		return conn.explain("verify "+quote(o.Name), err)
	}
	obj := &VerifyResult{
		TypeMeta: typeMeta("BackupVerification"),
		Metadata: ObjectMeta{Name: o.Name},
		Status: VerifyResultStatus{
			Intact: true, Location: r.GetBackup().GetLocation(), SHA256: r.GetBackup().GetSha256(),
			Revision: r.GetRevision(), TotalKeys: r.GetTotalKeys(), TotalSizeBytes: r.GetTotalSize(),
			Hash: r.GetHash(), StorageVersion: r.GetStorageVersion(),
		},
	}
	return o.PrintFlags.Print(o.Out, obj, func(w io.Writer) error {
		fmt.Fprintf(w, "backup %q is intact: sha256 %s, etcd trailer and database consistent\n", o.Name, r.GetBackup().GetSha256())
		_, err := fmt.Fprintf(w, "revision %d, %d keys, database %d bytes, etcd hash %d\n", r.GetRevision(), r.GetTotalKeys(), r.GetTotalSize(), r.GetHash())
		return err
	})
}
