package plugin

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// Shell completion asks the server: backup names (of --location, or of
// every location), storage locations and etcd targets. A server that
// cannot be reached completes nothing rather than failing the shell.

// completionTimeout bounds what a <TAB> waits for the server.
const completionTimeout = 5 * time.Second

// backupName accepts NAME or backup/NAME, so `-o name` output feeds back
// into the commands that take a backup's name.
func backupName(arg string) string {
	return strings.TrimPrefix(arg, "backup/")
}

// completeBackupNames completes the names of backups for a command taking
// at most max of them (0: any number).
func completeBackupNames(g *GlobalOptions, max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if max > 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []string
		_ = g.withServer(cmd, func(ctx context.Context, conn *Connection) error {
			// What the locations that answer hold; nothing to say
			// about the others in the middle of a completion.
			bs, _, err := g.listBackups(ctx, conn, "")
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			for _, a := range args {
				seen[backupName(a)] = true
			}
			for _, b := range bs {
				if n := b.GetName(); strings.HasPrefix(n, toComplete) && !seen[n] {
					seen[n] = true
					names = append(names, n)
				}
			}
			sort.Strings(names)
			return nil
		})
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeServerInfo completes --location or --target from GetServerInfo.
func completeServerInfo(g *GlobalOptions, pick func(*ebv1.GetServerInfoResponse) []string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		var out []string
		_ = g.withServer(cmd, func(ctx context.Context, conn *Connection) error {
			info, err := conn.Info.GetServerInfo(ctx, &ebv1.GetServerInfoRequest{})
			if err != nil {
				return err
			}
			for _, n := range pick(info) {
				if strings.HasPrefix(n, toComplete) {
					out = append(out, n)
				}
			}
			return nil
		})
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func locationNamesOf(info *ebv1.GetServerInfoResponse) []string {
	var out []string
	for _, l := range info.GetLocations() {
		out = append(out, l.GetName())
	}
	return out
}

func targetNamesOf(info *ebv1.GetServerInfoResponse) []string {
	var out []string
	for _, t := range info.GetTargets() {
		out = append(out, t.GetName())
	}
	return out
}

// withServer runs f against the server within completionTimeout.
func (g *GlobalOptions) withServer(cmd *cobra.Command, f func(context.Context, *Connection) error) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	conn, err := g.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(ctx, conn)
}
