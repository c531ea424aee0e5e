package plugin

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
)

// Break-glass access: with --storage-config FILE the plugin reads the
// storage locations FILE names itself, with the operator's own
// credentials, and never contacts the API server or the data server. It
// is for the day the control plane is down. The same request layer the
// data server runs serves the read-only calls in this process, so list,
// get, describe, verify, download and restore --local go through the
// same code and the same checks either way.

// StorageOpener opens the locations a --storage-config file names,
// read-only, and returns a dialer of in-process connections to a server
// of them, a description for messages, and what stops it. The command's
// binary provides it (cmd/kubectl-etcdbackup wires the server's read-only
// request layer in), so the plugin does not import the server.
type StorageOpener func(ctx context.Context, file string) (dial func(context.Context, string) (net.Conn, error), describe string, stop func(), err error)

// OpenStorage is the binary's StorageOpener; nil means this build cannot
// read storage locations directly.
var OpenStorage StorageOpener

// storageConfigUsage is the flag's help, the same on every command that
// takes it.
const storageConfigUsage = "read the storage locations in this `FILE` directly instead of asking the data server through the API server (for when the control plane is down): a YAML file with the `locations:` of the server's config (the etcdbackup-config ConfigMap), with credential files or variables that hold your own credentials; nothing is written to the locations"

// addStorageConfigFlag adds --storage-config to a command that only reads.
func addStorageConfigFlag(cmd *cobra.Command, g *GlobalOptions) {
	cmd.Flags().StringVar(&g.StorageConfig, "storage-config", "", storageConfigUsage)
}

// localStorage is the in-process server of a --storage-config, opened at
// the first Connect and stopped when the command ends.
type localStorage struct {
	once     sync.Once
	dial     func(context.Context, string) (net.Conn, error)
	describe string
	stop     func()
	err      error
}

// validateStorageConfig refuses flags that would reach the cluster beside
// --storage-config: with it, nothing does.
func (g *GlobalOptions) validateStorageConfig() error {
	if g.StorageConfig == "" {
		return nil
	}
	if g.ServerAddress != "" {
		return fmt.Errorf("--storage-config reads the storage locations directly; it does not go with --server-address")
	}
	return nil
}

// connectStorage opens the --storage-config locations once per command
// and returns a connection to their in-process server.
func (g *GlobalOptions) connectStorage(ctx context.Context) (*Connection, error) {
	if OpenStorage == nil {
		return nil, fmt.Errorf("--storage-config: this build of the plugin cannot read storage locations directly")
	}
	s := &g.local
	s.once.Do(func() {
		s.dial, s.describe, s.stop, s.err = OpenStorage(ctx, g.StorageConfig)
	})
	if s.err != nil {
		return nil, fmt.Errorf("--storage-config %s: %w", g.StorageConfig, s.err)
	}
	conn, err := grpc.NewClient("passthrough:///storage-config", append(dialOptions, grpc.WithContextDialer(s.dial))...)
	if err != nil {
		return nil, err
	}
	return &Connection{Client: client.New(conn), conn: conn, Target: s.describe}, nil
}

// closeStorage stops the in-process server, if one was started.
func (g *GlobalOptions) closeStorage() {
	if g.local.stop != nil {
		g.local.stop()
	}
}
