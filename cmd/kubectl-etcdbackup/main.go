// Command kubectl-etcdbackup is the kubectl plugin: `kubectl etcdbackup ...`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	// Every kubeconfig authentication client-go supports: exec plugins and
	// tokens are built in, this adds OIDC.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/plugin"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/breakglass"
)

func main() {
	// --storage-config: the server's read-only request layer, in process,
	// on locations this machine opens itself.
	plugin.OpenStorage = breakglass.Open
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := plugin.NewCmdRoot(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if args, ok := completionArgs(os.Args); ok {
		cmd.SetArgs(args)
	}
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		if !plugin.IsAlreadyReported(err) {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		// Distinct codes for usage errors, not found, refused and failed
		// backups or restores: see plugin.ExitCode and `--help`.
		os.Exit(plugin.ExitCode(err))
	}
}

// completionArgs turns the command line of the binary installed (copied
// or linked) as kubectl_complete-etcdbackup into cobra's __complete
// request: kubectl (v1.26 and later) runs that name from PATH with the
// words typed after `kubectl etcdbackup`, for `kubectl etcdbackup <TAB>`.
func completionArgs(argv []string) ([]string, bool) {
	if strings.TrimSuffix(filepath.Base(argv[0]), ".exe") != "kubectl_complete-etcdbackup" {
		return nil, false
	}
	return append([]string{cobra.ShellCompRequestCmd}, argv[1:]...), true
}
