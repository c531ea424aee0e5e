package plugin

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// DrillOptions are the options of `kubectl etcdbackup drill`.
type DrillOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Name       string
	WaitOptions
}

// NewCmdDrill returns the drill command.
func NewCmdDrill(g *GlobalOptions) *cobra.Command {
	o := &DrillOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats), WaitOptions: defaultWait()}
	cmd := &cobra.Command{
		Use:   "drill NAME",
		Short: "Prove a backup restores: restore it in the cluster into scratch space and compare it with the cluster it came from",
		Long: `drill asks the server to run a restore drill of a stored backup: an agent Job
downloads it (pinned to its SHA-256, decrypted with the target's drill
identity Secret), rebuilds an etcd member from it with etcd's own restore
code in scratch space, starts that etcd on loopback and compares the
revision, the number of keys and etcd's HashKV it answers with what the
backup recorded when it was taken — for a backup an agent took, what the
live cluster answered at that revision. Nothing in the cluster is touched.

The verdict is written into the backup: VERIFIED in list, the Verification
section of describe, status.verification of -o json. Targets with
drill: {schedule: …} in the server's config are drilled on that schedule.`,
		Example: examples(`
# Drill a backup and wait for the verdict
kubectl etcdbackup drill control-plane-20261201-020000 --wait

# Start a drill; its verdict appears later in describe and list's VERIFIED
kubectl etcdbackup drill control-plane-20261201-020000`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	f := cmd.Flags()
	o.WaitOptions.addFlags(f, "wait for the verdict; exit 5 when the backup fails its drill")
	o.PrintFlags.AddFlags(cmd, "output format of the backup, with --wait")
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *DrillOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	return nil
}

// Validate checks the flags.
func (o *DrillOptions) Validate() error { return o.PrintFlags.Validate() }

// Run starts the drill and, with --wait, waits for its verdict.
func (o *DrillOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// The one location that holds the backup, or its copy when the
	// original is gone (findBackup says so).
	if o.Location, err = o.resolveLocation(ctx, conn, "start drill of "+quote(o.Name), o.Name); err != nil {
		return err
	}
	resp, err := conn.Backups.DrillBackup(ctx, &ebv1.DrillBackupRequest{Name: o.Name, Location: o.Location})
	if err != nil {
		return conn.explain("start drill of "+quote(o.Name), err)
	}
	fmt.Fprintf(o.ErrOut, "drill of backup %q started (Job %s)\n", o.Name, resp.GetJob())
	if !o.Wait {
		return nil
	}
	b, err := o.wait(ctx, conn, resp.GetStartTime().AsTime())
	if err != nil {
		return err
	}
	if err := printBackups(o.Out, o.PrintFlags, []*ebv1.Backup{b}, true); err != nil {
		return err
	}
	v := b.GetVerification()
	switch v.GetResult() {
	case ebv1.VerificationResult_VERIFICATION_RESULT_SUCCEEDED:
		fmt.Fprintf(o.ErrOut, "drill of backup %q succeeded: %s\n", o.Name, v.GetMessage())
		return nil
	case ebv1.VerificationResult_VERIFICATION_RESULT_FAILED:
		return withCode(ExitFailed, fmt.Errorf("backup %q failed its drill: %s", o.Name, v.GetMessage()))
	}
	return fmt.Errorf("the drill of backup %q reached no verdict: %s", o.Name, v.GetMessage())
}

// wait polls the backup until it carries a verification at or after the
// drill's start: the drill's own verdict.
func (o *DrillOptions) wait(ctx context.Context, conn *Connection, started time.Time) (*ebv1.Backup, error) {
	var b *ebv1.Backup
	begin := time.Now()
	err := pollServer(ctx, conn, "wait for the drill of "+quote(o.Name), o.PollInterval, o.WaitTimeout, false,
		func(ctx context.Context) (*ebv1.GetBackupResponse, error) {
			return conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: o.Name, Location: o.Location})
		},
		func(resp *ebv1.GetBackupResponse) (bool, error) {
			b = resp.GetBackup()
			v := b.GetVerification()
			// The verdict's time is the Job's end, after its creation;
			// both come from the API server's clock.
			return v != nil && !v.GetTime().AsTime().Before(started.Truncate(time.Second)), nil
		})
	if wait.Interrupted(err) {
		return nil, stillRunning(ctx, begin, "the drill of backup "+quote(o.Name), fmt.Sprintf("its verdict will be in `kubectl etcdbackup describe %s`", o.Name))
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}
