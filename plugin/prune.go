package plugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"

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
{keepLast, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly,
maxAge} in the server's config; the server also applies it after each
successful scheduled backup and each full its delta capture stores) and
prints the backups it removed. With --dry-run it prints the whole plan:
every backup retention counts, whether it would be kept or removed, and
the rules that keep it.

It never removes the newest backup of a target, its newest verified one,
the full its delta chain grows from, nor one being downloaded or restored
(those are named and kept). It counts the target's scheduled backups and
the fulls its delta capture took (uploads never count), and with --all
the target's other agent backups too.`,
		Example: examples(`
# Show what retention would keep, by which rule, and remove; remove nothing
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
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "print what retention would keep (and by which rule) and remove; remove nothing")
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
	if o.DryRun && o.PrintFlags.Human() && o.PrintFlags.columns == nil {
		// A plan is read whole: what goes, and what stays by which rule.
		if len(resp.GetPruned()) == 0 {
			fmt.Fprintln(o.ErrOut, "Dry run: no backups would be removed.")
		} else {
			fmt.Fprintln(o.ErrOut, "Dry run: the backups marked remove would be removed, nothing was.")
		}
		return printPrunePlan(o.Out, resp, o.PrintFlags.Wide(), o.PrintFlags.NoHeaders, time.Now())
	}
	if len(resp.GetPruned()) == 0 {
		if o.PrintFlags.Human() || o.PrintFlags.columns != nil {
			fmt.Fprintln(o.ErrOut, "No backups to prune.")
			return nil
		}
	}
	return printBackups(o.Out, o.PrintFlags, resp.GetPruned(), false)
}

// prunePlanColumns are the columns of prune --dry-run's plan.
var prunePlanColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string"},
	{Name: "Location", Type: "string"},
	{Name: "Age", Type: "string"},
	{Name: "Plan", Type: "string"},
	{Name: "Rules", Type: "string"},
	{Name: "Created", Type: "string", Priority: 1},
}

// printPrunePlan writes every backup a dry run counted, newest first in
// each location: keep (with the rules that keep it), remove, or in use.
func printPrunePlan(out io.Writer, resp *ebv1.PruneBackupsResponse, wide, noHeaders bool, now time.Time) error {
	type row struct {
		b           *ebv1.Backup
		plan, rules string
	}
	var rows []row
	for _, k := range resp.GetKept() {
		rows = append(rows, row{k.GetBackup(), "keep", strings.Join(k.GetRules(), ", ")})
	}
	for _, b := range resp.GetPruned() {
		rows = append(rows, row{b, "remove", ""})
	}
	for _, b := range resp.GetInUse() {
		rows = append(rows, row{b, "keep", "in use (the next prune removes it)"})
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		if c := strings.Compare(a.b.GetLocation(), b.b.GetLocation()); c != 0 {
			return c
		}
		return ebv1.CompareListing(a.b.GetCreateTime().AsTime(), a.b.GetName(), b.b.GetCreateTime().AsTime(), b.b.GetName())
	})
	table := &metav1.Table{ColumnDefinitions: prunePlanColumns}
	for _, r := range rows {
		created := "<unknown>"
		if r.b.GetCreateTime() != nil {
			created = r.b.GetCreateTime().AsTime().UTC().Format(time.RFC3339)
		}
		table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{
			r.b.GetName(), r.b.GetLocation(), age(r.b, now), r.plan, orNone(r.rules), created,
		}})
	}
	return printers.NewTablePrinter(printers.PrintOptions{Wide: wide, NoHeaders: noHeaders}).PrintObj(table, out)
}
