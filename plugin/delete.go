package plugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// DeleteOptions are the options of `kubectl etcdbackup delete`.
type DeleteOptions struct {
	*GlobalOptions
	Names    []string
	Selector string
	All      bool
	// AllCopies (--all-copies) deletes each named backup in every
	// location that holds it: the original and its copies.
	AllCopies bool
	// Yes skips the confirmation asked on a terminal.
	Yes bool
}

// isTerminal reports whether r is an interactive terminal; a variable so
// that tests can stand in for a person at the keyboard.
var isTerminal = func(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// NewCmdDelete returns the delete command.
func NewCmdDelete(g *GlobalOptions) *cobra.Command {
	o := &DeleteOptions{GlobalOptions: g}
	cmd := &cobra.Command{
		Use:   "delete (NAME... | -l SELECTOR | --all)",
		Short: "Delete backups",
		Long: `delete removes backups by name (from whichever storage location holds each),
by label selector, or all of them (in every location, or in --location).

On a terminal it lists what it will delete and asks first, unless --yes.
Without a terminal, deleting by -l or --all needs --yes: a script that
builds a wrong selector must not empty the store.

A backup the server copied to other locations (copies: in its
configuration) is deleted by name from its own location only: its copies
are kept, and a note on stderr says where. --all-copies deletes it in
every location that holds it, the original and each copy (the same name and
SHA-256), one line per location; a location that refuses (a copy under
object lock) is reported and the others are still deleted. Given the name
of a backup whose original is gone, delete removes the copy it finds
first (a note says which). -l and --all without --location delete in
every location, copies included.`,
		Example: examples(`
# Delete one backup, from whichever location holds it
kubectl etcdbackup delete etcd-2026-01-31

# Delete two backups from location s3
kubectl etcdbackup delete etcd-2026-01-30 etcd-2026-01-31 --location s3

# Delete every backup labelled env=test, without asking
kubectl etcdbackup delete -l env=test --yes

# Delete every backup in location s3, after confirming on the terminal
kubectl etcdbackup delete --all --location s3

# Delete a backup and every copy of it the server made in other locations
kubectl etcdbackup delete etcd-2026-01-31 --all-copies`),
		ValidArgsFunction: completeBackupNames(g, 0),
		RunE:              runE(o),
	}
	cmd.Flags().StringVarP(&o.Selector, "selector", "l", "", "delete the backups matching this label selector (e.g. env=test)")
	cmd.Flags().BoolVar(&o.All, "all", false, "delete every backup (of --location, or of every location)")
	cmd.Flags().BoolVar(&o.AllCopies, "all-copies", false, "delete each named backup in every storage location that holds it, its original and its copies (from --location's, if given)")
	cmd.Flags().BoolVarP(&o.Yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// Complete takes the backups' names from the arguments.
func (o *DeleteOptions) Complete(_ *cobra.Command, args []string) error {
	o.Names = nil
	for _, a := range args {
		o.Names = append(o.Names, backupName(a))
	}
	return nil
}

// Validate checks that one way of choosing backups is given, and that a
// selection without a terminal to confirm it on says --yes.
func (o *DeleteOptions) Validate() error {
	ways := 0
	for _, given := range []bool{len(o.Names) > 0, o.Selector != "", o.All} {
		if given {
			ways++
		}
	}
	switch {
	case ways == 0:
		return errors.New("say what to delete: backup names, -l SELECTOR or --all")
	case ways > 1:
		return errors.New("give backup names, -l SELECTOR or --all, only one of them")
	case o.AllCopies && len(o.Names) == 0:
		return errors.New("--all-copies goes with backup names: -l and --all without --location delete in every location, copies included")
	case (o.Selector != "" || o.All) && !o.Yes && !isTerminal(o.In):
		return errors.New("deleting by -l or --all without a terminal to confirm on needs --yes")
	}
	return nil
}

// deletion is one backup to delete. named says to name its location
// when it is deleted (--all-copies: one line per location); kept are
// the locations of its copies, which stay.
type deletion struct {
	name, location string
	named          bool
	kept           []string
	// copy: the backup deleted is itself a copy (its original gone).
	copy bool
}

// Run deletes the chosen backups, reporting each as it goes, and fails if
// any failed. Every failure is printed here; the error returned carries
// the exit code only.
func (o *DeleteOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()

	var todo []deletion
	var failed error
	report := func(err error) {
		fmt.Fprintf(o.ErrOut, "error: %v\n", err)
		failed = err
	}
	if len(o.Names) > 0 {
		for _, name := range o.Names {
			ds, err := o.deletionsOf(ctx, conn, name)
			if err != nil {
				report(err)
				continue
			}
			if ds.incomplete && failed == nil {
				failed = withCode(ExitIncomplete, errAlreadyReported)
			}
			todo = append(todo, ds.todo...)
		}
	} else {
		bs, unavailable, err := o.listBackups(ctx, conn, o.Selector)
		if err != nil {
			return err
		}
		// A location the server cannot reach keeps its backups; the
		// others' are deleted, and the exit status says it was not all.
		o.warnUnavailable(unavailable, "its backups are not deleted")
		if len(unavailable) > 0 {
			failed = withCode(ExitIncomplete, errAlreadyReported)
		}
		for _, b := range bs {
			if b.GetPhase() == ebv1.BackupPhase_BACKUP_PHASE_COMPLETED {
				todo = append(todo, deletion{name: b.GetName(), location: b.GetLocation()})
			}
		}
		if len(todo) == 0 {
			fmt.Fprintln(o.ErrOut, "No backups found.")
			return failedOr(failed, nil)
		}
	}
	if len(todo) > 0 && !o.Yes && isTerminal(o.In) && !o.confirm(todo) {
		fmt.Fprintln(o.ErrOut, "nothing deleted")
		return failedOr(failed, nil)
	}
	for _, d := range todo {
		if _, err := conn.Backups.DeleteBackup(ctx, &ebv1.DeleteBackupRequest{Name: d.name, Location: d.location}); err != nil {
			// The server's message names the location; a copy under
			// object lock reads as a locked original does.
			report(conn.explain("delete backup "+quote(d.name), err))
			continue
		}
		if d.named {
			fmt.Fprintf(o.Out, "backup %q deleted from location %s\n", d.name, quote(d.location))
		} else {
			fmt.Fprintf(o.Out, "backup %q deleted\n", d.name)
		}
		if len(d.kept) > 0 {
			other := ""
			if d.copy {
				other = "other "
			}
			fmt.Fprintf(o.ErrOut, "Note: the %scopies of backup %q in %s are kept; delete --all-copies removes them too\n", other, d.name, strings.Join(d.kept, ", "))
		}
	}
	return failedOr(failed, nil)
}

// deletions are what deleting one named backup deletes.
type deletions struct {
	todo []deletion
	// incomplete: a location that may hold a copy could not be read
	// (--all-copies), as a warning said.
	incomplete bool
}

// deletionsOf finds what deleting the backup called name deletes: the
// backup findBackup finds (its copies kept), or, with --all-copies, that
// backup in every location that holds it, its copies first and the
// original last (interrupted, the delete leaves the original).
func (o *DeleteOptions) deletionsOf(ctx context.Context, conn *Connection, name string) (deletions, error) {
	op := "delete backup " + quote(name)
	if !o.AllCopies {
		if o.Location == "" {
			locs, err := o.locationNames(ctx, conn)
			if err != nil {
				return deletions{}, err
			}
			if len(locs) <= 1 {
				// One location: no copies; the server's answer to the
				// delete says whether it is there.
				return deletions{todo: []deletion{{name: name}}}, nil
			}
		}
		f, err := o.findBackups(ctx, conn, op, name)
		if err != nil {
			return deletions{}, err
		}
		b := f.backup
		return deletions{todo: []deletion{{name: name, location: b.GetLocation(), kept: keptCopies(b, f.all), copy: b.GetCopyOf() != nil}}}, nil
	}
	start, all, unavailable, err := o.everyCopy(ctx, conn, op, name)
	if err != nil {
		return deletions{}, err
	}
	o.warnUnavailable(unavailable, fmt.Sprintf("backup %q is not deleted there, if it is there", name))
	var ds deletions
	ds.incomplete = len(unavailable) > 0
	family := sameBackup(start, all)
	for _, copies := range []bool{true, false} {
		for _, b := range family {
			if (b.GetCopyOf() != nil) == copies {
				ds.todo = append(ds.todo, deletion{name: name, location: b.GetLocation(), named: true})
			}
		}
	}
	return ds, nil
}

// everyCopy returns the backup called name that --all-copies starts
// from (--location's, or the one findBackup would use) and the backups
// of that name in every location of the server, in location order,
// with the locations that could not be read.
func (o *DeleteOptions) everyCopy(ctx context.Context, conn *Connection, op, name string) (*ebv1.Backup, []*ebv1.Backup, []unavailableLocation, error) {
	var start *ebv1.Backup
	if o.Location != "" {
		resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name, Location: o.Location})
		if err != nil {
			return nil, nil, nil, conn.explain(op, err)
		}
		start = resp.GetBackup()
	}
	locs, err := serverLocations(ctx, conn)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(locs) <= 1 && start == nil {
		resp, err := conn.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: name})
		if err != nil {
			return nil, nil, nil, conn.explain(op, err)
		}
		start = resp.GetBackup()
	}
	others := slices.DeleteFunc(slices.Clone(locs), func(l string) bool { return l == start.GetLocation() })
	all, searched, unavailable, err := searchBackup(ctx, conn, op, name, others)
	if err != nil {
		return nil, nil, nil, err
	}
	if start == nil {
		if start, err = pickBackup(op, name, locs, all, searched, unavailable); err != nil {
			return nil, nil, nil, err
		}
	} else {
		all = append(all, start)
		slices.SortStableFunc(all, func(a, b *ebv1.Backup) int {
			return slices.Index(locs, a.GetLocation()) - slices.Index(locs, b.GetLocation())
		})
	}
	return start, all, unavailable, nil
}

// sameBackup returns start and the backups of all that are the same
// backup: the same SHA-256, and a copy of it, its original, or a copy
// of one of those (copyOf, or a location its copies name), in all's
// order.
func sameBackup(start *ebv1.Backup, all []*ebv1.Backup) []*ebv1.Backup {
	related := func(a, b *ebv1.Backup) bool {
		copiesTo := func(x, y *ebv1.Backup) bool {
			return x.GetCopyOf().GetLocation() == y.GetLocation() ||
				slices.ContainsFunc(y.GetCopies(), func(c *ebv1.BackupCopy) bool { return c.GetLocation() == x.GetLocation() })
		}
		return copiesTo(a, b) || copiesTo(b, a)
	}
	in := map[*ebv1.Backup]bool{start: true}
	for grew := true; grew; {
		grew = false
		for _, b := range all {
			if in[b] || b.GetSha256() == "" || b.GetSha256() != start.GetSha256() {
				continue
			}
			for f := range in {
				if related(b, f) {
					in[b], grew = true, true
					break
				}
			}
		}
	}
	var out []*ebv1.Backup
	for _, b := range all {
		if in[b] {
			out = append(out, b)
		}
	}
	if !slices.Contains(out, start) {
		out = append(out, start)
	}
	return out
}

// keptCopies are the locations of b's copies (its other copies, if b is
// one), which deleting b leaves: those the server says hold it, and
// those found.
func keptCopies(b *ebv1.Backup, all []*ebv1.Backup) []string {
	var out []string
	for _, c := range b.GetCopies() {
		if c.GetState() == ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED && !slices.Contains(out, c.GetLocation()) {
			out = append(out, c.GetLocation())
		}
	}
	for _, f := range sameBackup(b, all) {
		if f != b && !slices.Contains(out, f.GetLocation()) {
			out = append(out, f.GetLocation())
		}
	}
	return out
}

// failedOr returns an error that only carries failed's exit code (it was
// printed already), or ok.
func failedOr(failed, ok error) error {
	if failed == nil {
		return ok
	}
	return withCode(ExitCode(failed), errAlreadyReported)
}

// confirm lists what is about to go and reads y/yes from the terminal.
func (o *DeleteOptions) confirm(todo []deletion) bool {
	fmt.Fprintf(o.ErrOut, "about to delete %d backup(s):\n", len(todo))
	for _, d := range todo {
		fmt.Fprintf(o.ErrOut, "  %s (location %s)\n", d.name, d.location)
	}
	fmt.Fprint(o.ErrOut, "delete them? [y/N]: ")
	line, _ := bufio.NewReader(o.In).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}
