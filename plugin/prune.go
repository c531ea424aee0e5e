package plugin

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// PruneOptions are the options of `kubectl etcdbackup prune`.
type PruneOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Target     string
	DryRun     bool
	// All includes backups no schedule took.
	All bool
}

// NewCmdPrune returns the prune command.
func NewCmdPrune(g *GlobalOptions) *cobra.Command {
	o := &PruneOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats)}
	cmd := &cobra.Command{
		Use:   "prune [--target T] [--dry-run] [--all]",
		Short: "Remove the backups a target's retention no longer keeps",
		Long: `prune applies the retention of the server's etcd targets (retention:
{keepLast, maxAge} in the server's config; the server also applies it after
each successful scheduled backup) and prints the backups it removed.

It never removes the newest backup of a target, nor one being downloaded
or restored (those are named and kept), and only the target's scheduled
backups (those its schedule's agents stored; uploads never count) unless
--all, which adds the target's other agent backups.`,
		Example: examples(`
# Show what retention would remove, remove nothing
kubectl etcdbackup prune --dry-run

# Apply the retention of target control-plane in location s3
kubectl etcdbackup prune --target control-plane --location s3

# Apply it to on-demand backups of the target too, printing only the names
kubectl etcdbackup prune --target control-plane --all -o name`),
		Args: cobra.NoArgs,
		RunE: runE(o),
	}
	o.PrintFlags.AddFlags(cmd, "output format of the removed backups")
	cmd.Flags().StringVar(&o.Target, "target", "", "etcd target whose retention to apply (default: every target with a retention)")
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "print what would be removed, remove nothing")
	cmd.Flags().BoolVar(&o.All, "all", false, "also remove backups no schedule took (on-demand backups of the target)")
	_ = cmd.RegisterFlagCompletionFunc("target", completeServerInfo(g, targetNamesOf))
	return cmd
}

// Complete has nothing to fill in: every field comes from a flag.
func (o *PruneOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the flags.
func (o *PruneOptions) Validate() error { return o.PrintFlags.Validate() }

// Run asks the server to prune and prints what went.
func (o *PruneOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := conn.Backups.PruneBackups(ctx, &ebv1.PruneBackupsRequest{
		Location: o.Location, Target: o.Target, DryRun: o.DryRun, IncludeUnscheduled: o.All,
	})
	if err != nil {
		return conn.explain("prune", err)
	}
	for _, b := range resp.GetInUse() {
		fmt.Fprintf(o.ErrOut, "kept %q (location %s): it is being downloaded or restored; the next prune removes it\n", b.GetName(), b.GetLocation())
	}
	if len(resp.GetPruned()) == 0 {
		if o.PrintFlags.Human() || o.PrintFlags.columns != nil {
			fmt.Fprintln(o.ErrOut, "No backups to prune.")
			return nil
		}
	} else if o.DryRun && o.PrintFlags.Human() {
		fmt.Fprintln(o.ErrOut, "Dry run: these backups would be removed, nothing was.")
	}
	return printBackups(o.Out, o.PrintFlags, resp.GetPruned(), false)
}
