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
	Name   string
	Output string
}

// NewCmdVerify returns the verify command.
func NewCmdVerify(g *GlobalOptions) *cobra.Command {
	o := &VerifyOptions{GlobalOptions: g, Output: "table"}
	cmd := &cobra.Command{
		Use:   "verify NAME",
		Short: "Check a stored backup end to end on the server, without downloading it",
		Long: `verify has the server re-read a backup and check its stored SHA-256, etcd's own
SHA-256 trailer and the consistency of the etcd database inside, then prints
the revision, key count and size etcd reports. A corrupt backup is an error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := validateOutput(o.Output); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "output format: table, json or yaml")
	return cmd
}

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
	if o.Output == "json" || o.Output == "yaml" {
		return printMessage(o.Out, o.Output, r)
	}
	fmt.Fprintf(o.Out, "backup %q is intact: sha256 %s, etcd trailer and database consistent\n", o.Name, r.GetBackup().GetSha256())
	fmt.Fprintf(o.Out, "revision %d, %d keys, database %d bytes, etcd hash %d\n", r.GetRevision(), r.GetTotalKeys(), r.GetTotalSize(), r.GetHash())
	return nil
}
