package plugin

import (
	"context"
	"errors"
	"io"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// LogsOptions are the options of `kubectl etcdbackup logs`.
type LogsOptions struct {
	*GlobalOptions
	Name   string
	Follow bool
}

// NewCmdLogs returns the logs command.
func NewCmdLogs(g *GlobalOptions) *cobra.Command {
	o := &LogsOptions{GlobalOptions: g}
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print the log of the agent that took a backup",
		Example: examples(`
# Print the log of the agent that took a backup
kubectl etcdbackup logs control-plane-20260131-020000

# Follow the log while the agent is still running
kubectl etcdbackup logs control-plane-20260131-020000 -f`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	cmd.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep streaming while the agent runs")
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *LogsOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	return nil
}

// Validate has nothing to check: the server owns the naming rules and
// says which name it refuses.
func (o *LogsOptions) Validate() error { return nil }

// Run streams the log through the server (the plugin needs no
// permission on pods/log).
func (o *LogsOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	location, err := o.resolveLocation(ctx, conn, "logs of "+quote(o.Name), o.Name)
	if err != nil {
		return err
	}
	stream, err := conn.Backups.GetBackupLogs(ctx, &ebv1.GetBackupLogsRequest{Name: o.Name, Location: location, Follow: o.Follow})
	if err != nil {
		return conn.explain("logs of "+quote(o.Name), err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return conn.explain("logs of "+quote(o.Name), err)
		}
		if _, err := o.Out.Write(msg.GetData()); err != nil {
			return err
		}
	}
}
