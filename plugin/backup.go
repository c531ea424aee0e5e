package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// BackupOptions are the options of `kubectl etcdbackup backup`.
type BackupOptions struct {
	*GlobalOptions
	PrintFlags  *PrintFlags
	Name        string
	Target      string
	Compression string
	Labels      map[string]string
	WaitOptions
}

// NewCmdBackup returns the backup command.
func NewCmdBackup(g *GlobalOptions) *cobra.Command {
	o := &BackupOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats), WaitOptions: defaultWait()}
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Take a backup of an etcd target now, with an agent Job in the cluster",
		Long: `backup asks the server to snapshot one of the etcd targets in its
configuration. The server starts a backup agent Job that streams the
snapshot from etcd into the storage location; the request names only a
target and a location, never an endpoint or a credential.`,
		Example: examples(`
# Back up the server's default etcd target and wait until it is stored
kubectl etcdbackup backup --wait

# Back up target control-plane into location s3 under a chosen name
kubectl etcdbackup backup --target control-plane --location s3 --name before-upgrade --wait`),
		Args: cobra.NoArgs,
		RunE: runE(o),
	}
	f := cmd.Flags()
	f.StringVar(&o.Name, "name", "", "name of the backup (default: TARGET-YYYYMMDD-HHMMSS)")
	f.StringVar(&o.Target, "target", "", "etcd target from the server's config (default: the server's first)")
	_ = cmd.RegisterFlagCompletionFunc("target", completeServerInfo(g, targetNamesOf))
	f.StringVar(&o.Compression, "compression", "", "zstd or none (default: the target's setting)")
	f.StringToStringVar(&o.Labels, "labels", nil, "labels to store with the backup, as key=value pairs")
	o.WaitOptions.addFlags(f, "wait until the backup is Completed or Failed, printing each phase change on stderr")
	o.PrintFlags.AddFlags(cmd, "output format")
	return cmd
}

// Complete has nothing to fill in: every field comes from a flag, and the
// server picks the defaults.
func (o *BackupOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the flags.
func (o *BackupOptions) Validate() error {
	// "none" asks the server to override a target's compression.
	if o.Compression != ebv1.CompressionNoneName {
		if err := ebv1.ValidateCompression(o.Compression); err != nil {
			return errors.New("--" + err.Error()) // names the flag: "--compression …"
		}
	}
	if k, ok := ebv1.ReservedLabel(o.Labels); ok {
		return fmt.Errorf("--labels: %q is under %s, which only the server writes (it marks scheduled backups); choose another key", k, ebv1.ReservedLabelPrefix)
	}
	return o.PrintFlags.Validate()
}

// Run starts the backup and, with --wait, follows it to its end.
func (o *BackupOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := conn.Backups.CreateBackup(ctx, &ebv1.CreateBackupRequest{
		Name: o.Name, Location: o.Location, Target: o.Target, Compression: o.Compression, Labels: o.Labels,
	})
	if err != nil {
		return conn.explain("start backup", err)
	}
	b := resp.GetBackup()
	fmt.Fprintf(o.ErrOut, "backup %q of target %q started in location %q\n", b.GetName(), b.GetSource().GetTarget(), b.GetLocation())
	if o.Wait {
		if b, err = o.wait(ctx, conn, b); err != nil {
			return err
		}
	}
	if err := printBackups(o.Out, o.PrintFlags, []*ebv1.Backup{b}, true); err != nil {
		return err
	}
	if b.GetPhase() == ebv1.BackupPhase_BACKUP_PHASE_FAILED {
		printLastLogLines(ctx, o.ErrOut, conn, b)
		return withCode(ExitFailed, fmt.Errorf("backup %q failed: %s; see `kubectl etcdbackup logs %s`", b.GetName(), b.GetMessage(), b.GetName()))
	}
	return nil
}

// wait polls the backup every PollInterval until it leaves Running or
// WaitTimeout passes, printing each phase it sees with the time since the
// wait began on stderr, so a long backup is not silent. A poll that fails
// transiently (the server pod replaced) is retried for --retry-timeout.
func (o *BackupOptions) wait(ctx context.Context, conn *Connection, b *ebv1.Backup) (*ebv1.Backup, error) {
	start := time.Now()
	name, location := b.GetName(), b.GetLocation()
	phase := b.GetPhase()
	report := func() {
		fmt.Fprintf(o.ErrOut, "backup %q: %s after %s\n", name, phaseString(phase), time.Since(start).Round(time.Second))
	}
	report()
	if phase != ebv1.BackupPhase_BACKUP_PHASE_RUNNING {
		return b, nil
	}
	err := pollServer(ctx, conn, "wait for backup "+quote(name), o.PollInterval, o.WaitTimeout, false,
		func(ctx context.Context) (*ebv1.GetBackupResponse, error) {
			return conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name, Location: location})
		},
		func(resp *ebv1.GetBackupResponse) (bool, error) {
			b = resp.GetBackup()
			if b.GetPhase() != phase {
				phase = b.GetPhase()
				report()
			}
			return phase != ebv1.BackupPhase_BACKUP_PHASE_RUNNING, nil
		})
	if wait.Interrupted(err) {
		return nil, stillRunning(ctx, start, "backup "+quote(name), fmt.Sprintf("follow it with `kubectl etcdbackup logs %s -f`", name))
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}
