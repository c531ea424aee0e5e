package plugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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
builds a wrong selector must not empty the store.`,
		Example: examples(`
# Delete one backup, from whichever location holds it
kubectl etcdbackup delete etcd-2026-01-31

# Delete two backups from location s3
kubectl etcdbackup delete etcd-2026-01-30 etcd-2026-01-31 --location s3

# Delete every backup labelled env=test, without asking
kubectl etcdbackup delete -l env=test --yes

# Delete every backup in location s3, after confirming on the terminal
kubectl etcdbackup delete --all --location s3`),
		ValidArgsFunction: completeBackupNames(g, 0),
		RunE:              runE(o),
	}
	cmd.Flags().StringVarP(&o.Selector, "selector", "l", "", "delete the backups matching this label selector (e.g. env=test)")
	cmd.Flags().BoolVar(&o.All, "all", false, "delete every backup (of --location, or of every location)")
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
	case (o.Selector != "" || o.All) && !o.Yes && !isTerminal(o.In):
		return errors.New("deleting by -l or --all without a terminal to confirm on needs --yes")
	}
	return nil
}

type deletion struct{ name, location string }

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
			location, err := o.resolveLocation(ctx, conn, "delete backup "+quote(name), name)
			if err != nil {
				report(err)
				continue
			}
			todo = append(todo, deletion{name, location})
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
				todo = append(todo, deletion{b.GetName(), b.GetLocation()})
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
			report(conn.explain("delete backup "+quote(d.name), err))
			continue
		}
		fmt.Fprintf(o.Out, "backup %q deleted\n", d.name)
	}
	return failedOr(failed, nil)
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
