// Package plugin holds the cobra commands of `kubectl etcdbackup`, built the
// way kubectl's own commands are: an Options struct per command with
// Complete, Validate and Run, and IOStreams injected so every command runs
// in tests without a terminal.
package plugin

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
)

// DefaultNamespace is where the plugin looks for the server when -n is not
// given. Like velero's CLI, it does not use the kubeconfig context's
// namespace: the server lives in a namespace of its own, not the user's.
const DefaultNamespace = "etcdbackup-system"

// GlobalOptions are the flags every command shares: cli-runtime's
// kubeconfig flags and how to reach the server.
type GlobalOptions struct {
	ConfigFlags *genericclioptions.ConfigFlags
	// ServerAddress, when set, is dialled directly instead of tunnelling
	// through the API server (in-cluster use and tests).
	ServerAddress string
	// ServerService is the name of the server's Service.
	ServerService string
	// Location is the storage location. Empty means every location for
	// list and for finding a backup by name, and the server's default for
	// what is created (backup, upload).
	Location string
	// Timeout bounds connecting to the server.
	ConnectTimeout time.Duration
	// RetryTimeout is how long download, upload and --wait keep retrying
	// after the connection to the server broke, without progress.
	RetryTimeout time.Duration
	// StorageConfig, when set (--storage-config on the commands that only
	// read), is a file naming storage locations the plugin reads itself,
	// without the API server or the data server.
	StorageConfig string
	local         localStorage

	genericiooptions.IOStreams
}

// NewCmdRoot returns the `kubectl etcdbackup` command.
func NewCmdRoot(streams genericiooptions.IOStreams) *cobra.Command {
	g := &GlobalOptions{
		ConfigFlags:    genericclioptions.NewConfigFlags(true),
		ServerService:  "etcdbackup",
		ConnectTimeout: 30 * time.Second,
		RetryTimeout:   client.DefaultRetryTimeout,
		IOStreams:      streams,
	}
	cmd := &cobra.Command{
		Use:   "kubectl-etcdbackup",
		Short: "Take, list, download, upload and restore etcd backups through the Kubernetes API server",
		Long: `kubectl etcdbackup talks to the etcdbackup data server running in the cluster.
It reaches the server by port-forwarding through the API server, so it works
wherever "kubectl get pods" works: no Ingress, no DNS, no storage credentials.

Commands span every storage location unless --location names one: list shows
them all, and a command given a backup's name finds the location holding it.

Each call carries your kubeconfig user's bearer token (a token, token file,
exec plugin or OIDC; a client certificate has none), so that a server in
authorization mode SubjectAccessReview can check it against your RBAC on
backups.etcdbackup.io, restores.etcdbackup.io and locations.etcdbackup.io.
With --server-address only --token is sent.

` + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if g.RetryTimeout < 0 {
				return usageError(fmt.Errorf("--retry-timeout must be 0 (do not retry) or more, not %s", g.RetryTimeout))
			}
			return nil
		},
		Annotations: map[string]string{
			cobra.CommandDisplayNameAnnotation: "kubectl etcdbackup",
		},
	}
	flags := cmd.PersistentFlags()
	g.ConfigFlags.AddFlags(flags)
	flags.StringVar(&g.ServerAddress, "server-address", "", "HOST:PORT of the data server's gRPC port, dialled directly instead of through the API server")
	flags.StringVar(&g.ServerService, "server-service", g.ServerService, "name of the data server's Service in the namespace")
	flags.StringVar(&g.Location, "location", "", "storage location on the server (default: every location for list and for finding a backup by name; the server's default for new backups)")
	flags.DurationVar(&g.ConnectTimeout, "connect-timeout", g.ConnectTimeout, "how long to wait for the server to answer")
	flags.DurationVar(&g.RetryTimeout, "retry-timeout", g.RetryTimeout, "how long download, upload and --wait keep retrying without progress when the connection to the server breaks (a server pod replaced); 0 does not retry")

	cmd.AddCommand(
		NewCmdList(g),
		NewCmdGet(g),
		NewCmdDescribe(g),
		NewCmdUpload(g),
		NewCmdDownload(g),
		NewCmdDelete(g),
		NewCmdVersion(g),
		NewCmdBackup(g),
		NewCmdLogs(g),
		NewCmdVerify(g),
		NewCmdDrill(g),
		NewCmdRestore(g),
		NewCmdPrune(g),
		NewCmdInspect(g),
		NewCmdExtract(g),
		NewCmdRotateKeys(g),
		NewCmdLocation(g),
		NewCmdAudit(g),
	)
	_ = cmd.RegisterFlagCompletionFunc("location", completeServerInfo(g, locationNamesOf))
	setUsageErrors(cmd)
	return cmd
}

// Connection is an open connection to the server.
type Connection struct {
	*client.Client
	conn *grpc.ClientConn
	// Target describes what was reached, for messages.
	Target string
}

// Close releases the connection (and its tunnel).
func (c *Connection) Close() error { return c.conn.Close() }

// Connect opens a connection to the server: directly to ServerAddress when
// set, otherwise through a port-forward tunnel. Its calls retry for
// RetryTimeout when the connection breaks, saying so on ErrOut once per
// outage.
func (g *GlobalOptions) Connect(ctx context.Context) (*Connection, error) {
	return g.connectWith(ctx)
}

// connectWith connects as Connect does, with extra gRPC options for the
// server's connection (not --storage-config's in-process one).
func (g *GlobalOptions) connectWith(ctx context.Context, extra ...grpc.DialOption) (*Connection, error) {
	if g.StorageConfig != "" {
		return g.connectStorage(ctx)
	}
	c, err := g.connect(ctx, extra)
	if err != nil {
		return nil, err
	}
	c.Retry = client.Retry{Timeout: g.RetryTimeout, Flag: "--retry-timeout", OnRetry: g.notifyRetry()}
	return c, nil
}

// notifyRetry tells the user once per outage that the connection broke.
// A parallel download's streams each notice the same outage within moments
// of each other: one sentence says it for all of them.
func (g *GlobalOptions) notifyRetry() func(err error, left time.Duration) {
	var mu sync.Mutex
	var last time.Time
	return func(err error, left time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if !last.IsZero() && time.Since(last) < g.RetryTimeout {
			return
		}
		last = time.Now()
		fmt.Fprintf(g.ErrOut, "connection to the server lost (%s); retrying for up to %s\n", status.Convert(err).Message(), left.Round(time.Second))
	}
}

func (g *GlobalOptions) connect(ctx context.Context, extra []grpc.DialOption) (*Connection, error) {
	if g.ServerAddress != "" {
		opts := append(slices.Clip(dialOptions), extra...)
		if t := g.explicitToken(); t != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(staticToken(t)))
		}
		conn, err := grpc.NewClient("passthrough:///"+g.ServerAddress, opts...)
		if err != nil {
			return nil, fmt.Errorf("--server-address %q: %w", g.ServerAddress, err)
		}
		return &Connection{Client: client.New(conn), conn: conn, Target: g.ServerAddress}, nil
	}
	return g.connectTunnel(ctx, extra)
}

// command is what every verb's Options implements, kubectl's way; the
// embedded GlobalOptions gives globals.
type command interface {
	Complete(cmd *cobra.Command, args []string) error
	Validate() error
	Run(ctx context.Context) error
	globals() *GlobalOptions
}

func (g *GlobalOptions) globals() *GlobalOptions { return g }

// runE runs a command's Complete, Validate and Run in that order; a
// Validate failure is a usage error (exit code 2). What the command
// opened for --storage-config is closed when it returns.
func runE(o command) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := o.Complete(cmd, args); err != nil {
			return err
		}
		if err := o.Validate(); err != nil {
			return usageError(err)
		}
		if err := o.globals().validateStorageConfig(); err != nil {
			return usageError(err)
		}
		defer o.globals().closeStorage()
		return o.Run(cmd.Context())
	}
}
