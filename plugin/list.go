package plugin

import (
	"context"
	"sort"

	"github.com/spf13/cobra"
)

// ListOptions are the options of `kubectl etcdbackup list`.
type ListOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Selector   string
	// Target (--target) lists only that target's backups and, for a
	// person, the window a restore to a point can reach.
	Target string
	// Chain (--chain) lists the delta segments of that full backup's
	// chain instead of backups.
	Chain string
}

// NewCmdList returns the list command.
func NewCmdList(g *GlobalOptions) *cobra.Command {
	o := &ListOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats)}
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the backups in every storage location, or in one",
		Long: `list prints the backups of every storage location, newest first, or of
--location only.

A location with copies (copies: in the server's configuration) has each of
its backups copied, as stored, to its copy locations; the table then has a
COPIES column. An original's says how many places hold it and what is not
copied yet, and why: "2/2", "1/2 offsite: pending", "1/2 offsite: retrying
3m" (failing for 3m), "conflict" (the copy location holds another backup of
that name), "deleted" (the copy was deleted there: it is not copied again),
"unknown" (the copy location cannot be read now). Listing every location, a
copy is shown in its original's row, not on its own; -o name prints the
name once. A copy whose original is not listed, and every copy of
--location, is a row of its own: "copy of default". The documents (-o json,
yaml, jsonpath, go-template, custom-columns) hold every backup of every
location listed, copies too, with status.copyOf and status.copies.`,
		Example: examples(`
# List the backups in every storage location, newest first
kubectl etcdbackup list

# List the backups in location s3, with source, revision, compression, SHA-256 and labels
kubectl etcdbackup list -o wide --location s3

# List the backups labelled env=prod as a BackupList in JSON
kubectl etcdbackup list -l env=prod -o json

# List the copies kept in location offsite (COPIES says what each is a copy of)
kubectl etcdbackup list --location offsite

# List target app-etcd's backups and the window restore --to-revision/--to-time can reach
kubectl etcdbackup list --target app-etcd

# Print only the names of the completed backups
kubectl etcdbackup list -o jsonpath='{range .items[?(@.status.phase=="Completed")]}{.metadata.name}{"\n"}{end}'`),
		Args: cobra.NoArgs,
		RunE: runE(o),
	}
	o.PrintFlags.AddFlags(cmd, "output format")
	cmd.Flags().StringVarP(&o.Selector, "selector", "l", "", "label selector to filter backups (e.g. env=prod)")
	cmd.Flags().StringVar(&o.Chain, "chain", "", "list the delta segments of the chain that starts from this full `BACKUP` (in --location, or the server's default), in the order they were stored")
	cmd.Flags().StringVar(&o.Target, "target", "", "list only this etcd target's backups, and the recoverable window of a restore to a point (earliest and latest revision and time)")
	addStorageConfigFlag(cmd, g)
	return cmd
}

// Complete has nothing to fill in: every field comes from a flag.
func (o *ListOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the flags.
func (o *ListOptions) Validate() error { return o.PrintFlags.Validate() }

// Run lists the backups.
func (o *ListOptions) Run(ctx context.Context) error {
	traceAt(traceInit, "plugin initialised")
	trace("list started")
	defer gcOnlyAtHeapLimit()()
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		conn.Close()
		trace("connection closed")
	}()
	if o.Chain != "" {
		segs, err := listLocation(ctx, conn, o.Location, "", o.Chain)
		if err != nil {
			return conn.explain("list the delta chain of "+quote(o.Chain), err)
		}
		sort.Slice(segs, func(i, j int) bool {
			return segs[i].GetDelta().GetFirstRevision() < segs[j].GetDelta().GetFirstRevision()
		})
		return printBackups(o.Out, o.PrintFlags, segs, false)
	}
	bs, unavailable, listErr := o.listBackups(ctx, conn, o.Selector)
	trace("backups listed")
	if o.Target != "" {
		bs = ofTarget(bs, o.Target)
	}
	if listErr != nil && len(bs) == 0 {
		return listErr
	}
	if len(bs) == 0 && (o.PrintFlags.Human() || o.PrintFlags.columns != nil) {
		// kubectl's notice, on stderr so that a script reading stdout
		// sees an empty table.
		if _, err := o.ErrOut.Write([]byte("No backups found.\n")); err != nil {
			return err
		}
	} else if err := printBackupList(o.Out, o.PrintFlags, bs, o.Location == ""); err != nil {
		return err
	}
	trace("backups printed")
	if o.Target != "" && o.PrintFlags.Human() {
		if err := o.printWindow(ctx, conn); err != nil {
			return err
		}
	}
	// What could be listed is printed. A location that failed is still
	// an error (and the exit status), as kubectl get does; one the
	// server cannot reach is a warning after the list, where a person
	// sees it, and a distinct exit status, so a script does not take
	// the list for the whole (docs/scripting.md).
	if listErr != nil {
		o.warnUnavailable(unavailable, "its backups are not listed")
		return listErr
	}
	if len(unavailable) > 0 {
		o.warnUnavailable(unavailable, "its backups are not listed")
		return withCode(ExitIncomplete, errAlreadyReported)
	}
	return nil
}
