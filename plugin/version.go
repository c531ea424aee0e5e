package plugin

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
)

// VersionOptions are the options of `kubectl etcdbackup version`.
type VersionOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	ClientOnly bool
}

// NewCmdVersion returns the version command.
func NewCmdVersion(g *GlobalOptions) *cobra.Command {
	o := &VersionOptions{GlobalOptions: g, PrintFlags: newPrintFlags(plainFormats)}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's and the server's versions, and the server's storage locations",
		Example: examples(`
# Print the plugin's and the server's versions, storage locations and etcd targets
kubectl etcdbackup version

# Print the plugin's version only, without contacting the server
kubectl etcdbackup version --client`),
		Args: cobra.NoArgs,
		RunE: runE(o),
	}
	cmd.Flags().BoolVar(&o.ClientOnly, "client", false, "print the plugin's version only, without contacting the server")
	o.PrintFlags.AddFlags(cmd, "output format")
	return cmd
}

// Complete has nothing to fill in: every field comes from a flag.
func (o *VersionOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the flags.
func (o *VersionOptions) Validate() error { return o.PrintFlags.Validate() }

// Run prints the versions.
func (o *VersionOptions) Run(ctx context.Context) error {
	info := &ebv1.GetServerInfoResponse{}
	if !o.ClientOnly {
		conn, err := o.Connect(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if info, err = conn.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{}); err != nil {
			return conn.explain("get server version", err)
		}
	}
	v := &Version{TypeMeta: typeMeta("Version"), ClientVersion: BuildInfo{Version: version.Version, GitCommit: version.Commit()}}
	if !o.ClientOnly {
		v.Server = serverInfo(info)
	}
	return o.PrintFlags.Print(o.Out, v, func(w io.Writer) error { return o.printText(w, info) })
}

// printText writes the versions, locations and targets for a person.
func (o *VersionOptions) printText(w io.Writer, info *ebv1.GetServerInfoResponse) error {
	fmt.Fprintf(w, "Client Version: %s\n", version.Version)
	if o.ClientOnly {
		return nil
	}
	fmt.Fprintf(w, "Server Version: %s\n", info.GetVersion())
	for _, l := range info.GetLocations() {
		def := ""
		if l.GetDefault() {
			def = " (default)"
		}
		state := "available"
		if l.GetUnavailable() {
			state = "unavailable: " + l.GetError()
		}
		fmt.Fprintf(w, "Storage Location: %s%s, %s: %s, %s\n", l.GetName(), def, l.GetType(), l.GetDescription(), state)
	}
	for _, t := range info.GetTargets() {
		def := ""
		if t.GetDefault() {
			def = " (default)"
		}
		fmt.Fprintf(w, "etcd Target: %s%s, %s\n", t.GetName(), def, strings.Join(t.GetEndpoints(), ","))
	}
	return nil
}
