package plugin

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
)

// The human formats a command offers before the machine ones. "wide" is
// offered only where a table has wide columns (or, for upload, where it
// always was); tables also take custom-columns and --no-headers.
var (
	tableFormats = []string{"table", "wide"}
	plainFormats = []string{"table"}
)

// PrintFlags is a command's -o flag, after kubectl's get_flags.go: the one
// list of allowed formats feeds the flag's help, its shell completion and
// the error for an unknown format, so what the help promises is what is
// accepted. Machine formats (json, yaml, kyaml, jsonpath…, go-template…)
// are cli-runtime's own printers; name and custom-columns are kubectl's
// behaviour written here (kubectl keeps custom-columns outside cli-runtime).
type PrintFlags struct {
	// OutputFormat is the value of -o; the first human format by default.
	OutputFormat string
	// NoHeaders leaves out table and custom-columns headers.
	NoHeaders bool

	human   []string
	table   bool
	machine *genericclioptions.PrintFlags
	printer printers.ResourcePrinter
	columns []column
}

// newPrintFlags returns -o accepting the human formats (the first is the
// default) and every machine format. A command whose human view is a table
// passes tableFormats and gets custom-columns and --no-headers too.
func newPrintFlags(human []string) *PrintFlags {
	return &PrintFlags{
		OutputFormat: human[0],
		human:        human,
		table:        len(human) > 1,
		machine:      genericclioptions.NewPrintFlags(""),
	}
}

// AllowedFormats returns the formats -o accepts.
func (f *PrintFlags) AllowedFormats() []string {
	out := append([]string(nil), f.human...)
	out = append(out, f.machine.AllowedFormats()...)
	if f.table {
		out = append(out, "custom-columns")
	}
	return out
}

// AddFlags declares -o (and --no-headers for tables) on cmd; what says
// what is printed, e.g. "output format of the stored backup".
func (f *PrintFlags) AddFlags(cmd *cobra.Command, what string) {
	cmd.Flags().StringVarP(&f.OutputFormat, "output", "o", f.OutputFormat, what+": "+orList(f.AllowedFormats()))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return f.AllowedFormats(), cobra.ShellCompDirectiveNoFileComp
	})
	if f.table {
		cmd.Flags().BoolVar(&f.NoHeaders, "no-headers", false, "leave out the header line of table and custom-columns output")
	}
}

// Validate refuses a format the command does not print and parses
// jsonpath, go-template and custom-columns expressions, so a typo is a
// usage error before the server is contacted. (A -file format reads its
// file here, as kubectl's ToPrinter does.)
func (f *PrintFlags) Validate() error {
	format, arg, _ := strings.Cut(f.OutputFormat, "=")
	for _, h := range f.human {
		if f.OutputFormat == h {
			return nil
		}
	}
	unknown := fmt.Errorf("-o %q is not a known output format; use one of %s", f.OutputFormat, strings.Join(f.AllowedFormats(), ", "))
	if format == "custom-columns" {
		if !f.table {
			return unknown
		}
		cols, err := parseColumns(arg)
		if err != nil {
			return fmt.Errorf("-o custom-columns: %w", err)
		}
		f.columns = cols
		return nil
	}
	if f.OutputFormat == "name" {
		return nil
	}
	*f.machine.OutputFormat = f.OutputFormat
	p, err := f.machine.ToPrinter()
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		return unknown
	}
	if err != nil {
		return fmt.Errorf("-o %s: %w", format, err)
	}
	f.printer = p
	return nil
}

// Human reports whether the format is the command's own human view.
func (f *PrintFlags) Human() bool {
	if f == nil {
		return true
	}
	for _, h := range f.human {
		if f.OutputFormat == h {
			return true
		}
	}
	return false
}

// Wide reports whether -o wide was asked for.
func (f *PrintFlags) Wide() bool { return f.OutputFormat == "wide" }

// Print writes obj in the chosen format; human writes the command's own
// view (a table, or sentences) for the human formats.
func (f *PrintFlags) Print(w io.Writer, obj runtime.Object, human func(io.Writer) error) error {
	switch {
	case f.Human():
		return human(w)
	case f.OutputFormat == "name":
		return printNames(w, obj)
	case f.columns != nil:
		return printColumns(w, obj, f.columns, f.NoHeaders)
	case f.printer == nil:
		return errors.New("internal error: Print called before Validate")
	}
	format, _, _ := strings.Cut(f.OutputFormat, "=")
	switch format {
	case "json", "yaml", "kyaml":
		// Typed, so fields keep the order apiVersion, kind, metadata,
		// spec, status.
		return f.printer.PrintObj(obj, w)
	}
	// Templates walk maps: numbers stay integers (json.Unmarshal into
	// interface{} would make sizes floats, printed as 3.1e+06).
	u, err := toUnstructured(obj)
	if err != nil {
		return err
	}
	return f.printer.PrintObj(u, w)
}

// orList writes a, b or c.
func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// examples lays out a command's examples as kubectl's templates.Examples
// does: a "# what it does" line above each command, every line indented by
// two spaces. Continuation lines keep their own extra indent.
func examples(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		if l = strings.TrimRight(l, " \t"); l != "" {
			l = "  " + l
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}
