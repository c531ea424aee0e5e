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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := plugin.NewCmdRoot(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	// Installed (copied or linked) as kubectl_complete-etcdbackup, the
	// binary is its own completion helper for `kubectl etcdbackup <TAB>`:
	// kubectl runs it with the words typed, and cobra's __complete answers.
	if name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe"); name == "kubectl_complete-etcdbackup" {
		cmd.SetArgs(append([]string{cobra.ShellCompRequestCmd}, os.Args[1:]...))
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
