package plugin

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// NewCmdLocation returns the location command, whose subcommands work
// with the server's storage locations; alone it prints its help.
func NewCmdLocation(g *GlobalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "location",
		Short: "Work with the server's storage locations",
		Long: `location works with the data server's storage locations (the locations: of its
configuration; ` + "`kubectl etcdbackup version`" + ` lists them).`,
		Example: examples(`
# Check that storage location s3 works, step by step
kubectl etcdbackup location check s3`),
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath()))
			}
			return cmd.Help()
		},
	}
	cmd.AddCommand(NewCmdLocationCheck(g))
	return cmd
}

// LocationCheckOptions are the options of `kubectl etcdbackup location
// check`.
type LocationCheckOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Name       string
}

// NewCmdLocationCheck returns the location check command.
func NewCmdLocationCheck(g *GlobalOptions) *cobra.Command {
	o := &LocationCheckOptions{GlobalOptions: g, PrintFlags: newPrintFlags(plainFormats)}
	cmd := &cobra.Command{
		Use:   "check NAME",
		Short: "Check that a storage location works, naming what its store does not support",
		Long: `check has the server run a round trip against storage location NAME with probe
objects of its own, never a backup, through the calls backups take:

  write               a small object and its manifest, read back
  multipart write     (S3) an object of two parts
  ranged read         part of an object, across the part boundary on S3
  list                the probe is listed (no listing of backups ever shows it)
  conditional create  of two uploads of one name only one is stored
  checksums           (S3) the request checksums the AWS SDK sends
  object lock         (when the location asks for it)
  delete              the probes are removed

It prints each step's result. A failed step gives the store's error and the
setting or permission that works around it, such as requestChecksum:
when_required for a store that refuses the AWS SDK's checksum headers, or
s3:DeleteObject for credentials that may not delete. The probes are removed
even when a step fails (unless the credentials may not delete them; a later
check removes them).

Run it after configuring a location and after changing its store or
credentials; the server also runs it once when it starts and logs failed
steps as warnings. It exits 5 when a step failed.`,
		Example: examples(`
# Check storage location s3
kubectl etcdbackup location check s3

# The same, as JSON for a script: .status.ok and each step
kubectl etcdbackup location check s3 -o json`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeLocationArg(g),
		RunE:              runE(o),
	}
	o.PrintFlags.AddFlags(cmd, "output format")
	return cmd
}

// completeLocationArg completes the one argument with the server's
// location names.
func completeLocationArg(g *GlobalOptions) cobra.CompletionFunc {
	names := completeServerInfo(g, locationNamesOf)
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names(cmd, args, toComplete)
	}
}

// Complete takes the location's name from the arguments.
func (o *LocationCheckOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = args[0]
	return nil
}

// Validate checks the flags: --location, if given, must be NAME.
func (o *LocationCheckOptions) Validate() error {
	if o.Location != "" && o.Location != o.Name {
		return fmt.Errorf("--location %q and NAME %q name different locations; give NAME alone", o.Location, o.Name)
	}
	return o.PrintFlags.Validate()
}

// Run asks the server to check the location and prints each step; a
// failed step makes it an error (ExitFailed) naming the steps.
func (o *LocationCheckOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	what := "check storage location " + quote(o.Name)
	resp, err := conn.Backups.CheckLocation(ctx, &ebv1.CheckLocationRequest{Location: o.Name})
	if err != nil {
		return conn.explain(what, err)
	}
	obj := locationCheckObject(resp)
	if err := o.PrintFlags.Print(o.Out, obj, func(w io.Writer) error {
		return printLocationCheckTable(w, resp)
	}); err != nil {
		return err
	}
	var failed []string
	for _, s := range resp.GetSteps() {
		if s.GetResult() == "failed" {
			failed = append(failed, s.GetName())
		}
	}
	if !resp.GetOk() || len(failed) > 0 {
		return withCode(ExitFailed, fmt.Errorf("storage location %q failed the check at: %s; each failed step says what to change", resp.GetLocation(), strings.Join(failed, ", ")))
	}
	return nil
}

var locationCheckColumns = []metav1.TableColumnDefinition{
	{Name: "Step", Type: "string"},
	{Name: "Result", Type: "string"},
	{Name: "Duration", Type: "string"},
	{Name: "Detail/Advice", Type: "string"},
}

// printLocationCheckTable writes a row per step: what happened, then,
// for a failure, what to do about it.
func printLocationCheckTable(w io.Writer, resp *ebv1.CheckLocationResponse) error {
	table := &metav1.Table{ColumnDefinitions: locationCheckColumns}
	for _, s := range resp.GetSteps() {
		text := s.GetDetail()
		if a := s.GetAdvice(); a != "" {
			text += "; " + a
		}
		table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{
			s.GetName(), s.GetResult(), (time.Duration(s.GetDurationMs()) * time.Millisecond).String(), text,
		}})
	}
	return printers.NewTablePrinter(printers.PrintOptions{}).PrintObj(table, w)
}

// LocationCheck is what `location check -o json|yaml` prints: a storage
// location's check, step by step.
type LocationCheck struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        ObjectMeta          `json:"metadata"`
	Status          LocationCheckStatus `json:"status"`
}

// LocationCheckStatus is the outcome: OK when no step failed.
type LocationCheckStatus struct {
	// Type is the location's backend: "filesystem" or "s3".
	Type  string              `json:"type"`
	OK    bool                `json:"ok"`
	Steps []LocationCheckStep `json:"steps"`
}

// LocationCheckStep is one step, in the order they ran.
type LocationCheckStep struct {
	Name string `json:"name"`
	// Result is "ok", "failed" or "skipped".
	Result string `json:"result"`
	// Detail is what happened; Advice, for a failure, what to change.
	Detail         string `json:"detail,omitempty"`
	Advice         string `json:"advice,omitempty"`
	DurationMillis int64  `json:"durationMillis"`
}

func (c *LocationCheck) DeepCopyObject() runtime.Object {
	d := *c
	d.Status.Steps = append([]LocationCheckStep(nil), c.Status.Steps...)
	return &d
}

var _ runtime.Object = &LocationCheck{}

func locationCheckObject(resp *ebv1.CheckLocationResponse) *LocationCheck {
	c := &LocationCheck{
		TypeMeta: typeMeta("LocationCheck"),
		Metadata: ObjectMeta{Name: resp.GetLocation()},
		Status:   LocationCheckStatus{Type: resp.GetType(), OK: resp.GetOk(), Steps: []LocationCheckStep{}},
	}
	for _, s := range resp.GetSteps() {
		c.Status.Steps = append(c.Status.Steps, LocationCheckStep{
			Name: s.GetName(), Result: s.GetResult(), Detail: s.GetDetail(), Advice: s.GetAdvice(), DurationMillis: s.GetDurationMs(),
		})
	}
	return c
}
