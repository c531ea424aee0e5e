package plugin

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// The format sets commands choose from. A command lists only formats that
// change what it prints; "wide" is offered only where a table has wide
// columns (or, for upload, where it always was).
var (
	tableFormats = []string{"table", "wide", "json", "yaml"}
	plainFormats = []string{"table", "json", "yaml"}
)

// PrintFlags is a command's -o flag, after kubectl's get_flags.go: the one
// list of allowed formats feeds the flag's help, its shell completion and
// Validate's error, so what the help promises is what is accepted.
type PrintFlags struct {
	// OutputFormat is the value of -o; the first allowed format by default.
	OutputFormat string
	allowed      []string
}

// newPrintFlags returns -o accepting formats, the first being the default.
func newPrintFlags(formats []string) *PrintFlags {
	return &PrintFlags{OutputFormat: formats[0], allowed: formats}
}

// AllowedFormats returns the formats -o accepts.
func (f *PrintFlags) AllowedFormats() []string { return append([]string(nil), f.allowed...) }

// AddFlags declares -o on cmd; what says what is printed, e.g. "output
// format of the stored backup".
func (f *PrintFlags) AddFlags(cmd *cobra.Command, what string) {
	cmd.Flags().StringVarP(&f.OutputFormat, "output", "o", f.OutputFormat, what+": "+orList(f.allowed))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return f.AllowedFormats(), cobra.ShellCompDirectiveNoFileComp
	})
}

// Validate refuses a format the command does not print.
func (f *PrintFlags) Validate() error {
	for _, a := range f.allowed {
		if f.OutputFormat == a {
			return nil
		}
	}
	return fmt.Errorf("-o %q is not a known output format; use one of %s", f.OutputFormat, strings.Join(f.allowed, ", "))
}

// Structured reports whether the format is JSON or YAML rather than text.
func (f *PrintFlags) Structured() bool {
	return f.OutputFormat == "json" || f.OutputFormat == "yaml"
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
