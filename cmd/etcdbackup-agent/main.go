// Command etcdbackup-agent runs in the cluster as a Job the data server
// creates: `backup` snapshots one etcd member into the server. It talks to
// the server by its in-cluster Service address and never sees storage
// credentials; etcd's client certificates come from files a Secret mounts.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "etcdbackup-agent",
		Short:         "Backup and restore agent of kubectl-etcdbackup",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newBackupCmd(), newRestoreCmd())
	return root
}

// etcdFlags are how an agent reaches etcd.
type etcdFlags struct {
	endpoint           string
	endpoints          []string
	cacert, cert, key  string
	insecurePlaintext  bool
	insecureSkipVerify bool
	dialTimeout        time.Duration
}

func (f *etcdFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.endpoint, "endpoint", "", "the etcd member to use, https://HOST:PORT (a snapshot is one member's state)")
	fl.StringSliceVar(&f.endpoints, "endpoints", nil, "the cluster's members; the agent snapshots a healthy follower, else the leader")
	fl.StringVar(&f.cacert, "cacert", "", "CA bundle that signed etcd's serving certificate")
	fl.StringVar(&f.cert, "cert", "", "client certificate for etcd")
	fl.StringVar(&f.key, "key", "", "client key for etcd")
	fl.BoolVar(&f.insecurePlaintext, "insecure-plaintext", false, "allow an http:// endpoint (no TLS); only when explicitly asked for")
	fl.BoolVar(&f.insecureSkipVerify, "insecure-skip-tls-verify", false, "do not verify etcd's serving certificate")
	fl.DurationVar(&f.dialTimeout, "dial-timeout", 10*time.Second, "how long to wait for etcd")
}

// client connects to the one member to use: --endpoint, or the member
// --endpoints chooses.
func (f *etcdFlags) client(ctx context.Context) (*clientv3.Client, error) {
	switch {
	case f.endpoint != "" && len(f.endpoints) > 0:
		return nil, errors.New("give --endpoint or --endpoints, not both")
	case f.endpoint == "" && len(f.endpoints) == 0:
		return nil, errors.New("--endpoint or --endpoints is required")
	case f.endpoint == "":
		return f.choose(ctx)
	}
	return f.connect(f.endpoint)
}

// choose snapshots a follower when it can, to spare the leader the load of
// streaming the database.
func (f *etcdFlags) choose(ctx context.Context) (*clientv3.Client, error) {
	var leader *clientv3.Client
	var errs []error
	for _, ep := range f.endpoints {
		c, err := f.connect(ep)
		if err != nil {
			return nil, err
		}
		sctx, cancel := context.WithTimeout(ctx, f.dialTimeout)
		st, err := c.Status(sctx, ep)
		cancel()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			c.Close()
		case st.Leader != st.Header.MemberId:
			f.endpoint = ep
			if leader != nil {
				leader.Close()
			}
			return c, nil
		case leader == nil:
			leader, f.endpoint = c, ep
		default:
			c.Close()
		}
	}
	if leader != nil {
		return leader, nil
	}
	return nil, fmt.Errorf("no etcd member answered: %w", errors.Join(errs...))
}

func (f *etcdFlags) connect(endpoint string) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: f.dialTimeout, Logger: zap.NewNop()}
	switch {
	case strings.HasPrefix(endpoint, "http://"):
		if !f.insecurePlaintext {
			return nil, fmt.Errorf("etcd endpoint %s is plain http: pass --insecure-plaintext to allow it, or use https", endpoint)
		}
	case strings.HasPrefix(endpoint, "https://"):
		info := transport.TLSInfo{TrustedCAFile: f.cacert, CertFile: f.cert, KeyFile: f.key, InsecureSkipVerify: f.insecureSkipVerify}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS files: %w", err)
		}
		cfg.TLS = tlsCfg
	default:
		return nil, fmt.Errorf("etcd endpoint %q must start with https:// (or http:// with --insecure-plaintext)", endpoint)
	}
	return clientv3.New(cfg)
}

func newBackupCmd() *cobra.Command {
	var ef etcdFlags
	var serverAddr string
	opts := backup.Options{}
	cmd := &cobra.Command{
		Use:   "backup --endpoint URL --server HOST:PORT --name NAME",
		Short: "Stream a snapshot of one etcd member to the data server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
			if opts.Name == "" {
				return errors.New("--name is required")
			}
			etcd, err := ef.client(ctx)
			if err != nil {
				return err
			}
			defer etcd.Close()
			conn, err := grpc.NewClient("passthrough:///"+serverAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return fmt.Errorf("--server %q: %w", serverAddr, err)
			}
			defer conn.Close()
			opts.Endpoint = ef.endpoint
			log.Info("snapshot starting", "endpoint", ef.endpoint, "backup", opts.Name, "location", opts.Location, "compression", opts.Compression)
			start := time.Now()
			b, err := backup.Run(ctx, etcd, client.New(conn), opts)
			if err != nil {
				log.Error("backup failed", "backup", opts.Name, "error", err.Error())
				return err
			}
			log.Info("backup stored", "backup", b.GetName(), "location", b.GetLocation(), "size", b.GetSize(), "sha256", b.GetSha256(),
				"rawSize", b.GetRawSize(), "revision", b.GetEtcd().GetRevision(), "seconds", time.Since(start).Seconds())
			return nil
		},
	}
	ef.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&serverAddr, "server", "", "data server gRPC address, e.g. etcdbackup.etcdbackup-system.svc:50051")
	fl.StringVar(&opts.Name, "name", "", "name of the backup")
	fl.StringVar(&opts.Location, "location", "", "storage location (default: the server's default)")
	fl.StringVar(&opts.Target, "target", "", "name of the etcd target, recorded with the backup")
	fl.StringVar(&opts.Compression, "compression", "", "\"zstd\" to compress, empty for none")
	fl.StringToStringVar(&opts.Labels, "labels", nil, "labels of the backup")
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

func newRestoreCmd() *cobra.Command {
	var serverAddr, name, location, workDir string
	var m snapshot.Member
	cmd := &cobra.Command{
		Use:   "restore --server HOST:PORT --name NAME --data-dir DIR --member-name M --initial-cluster C --initial-advertise-peer-urls U",
		Short: "Download a backup through the data server and rebuild one etcd member's data directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
			if name == "" {
				return errors.New("--name is required")
			}
			if err := snapshot.CheckDataDir(m); err != nil {
				return err
			}
			if workDir == "" {
				workDir = filepath.Join(filepath.Dir(filepath.Clean(m.DataDir)), ".etcdbackup-restore")
			}
			if err := os.MkdirAll(workDir, 0o700); err != nil {
				return err
			}
			conn, err := grpc.NewClient("passthrough:///"+serverAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return fmt.Errorf("--server %q: %w", serverAddr, err)
			}
			defer conn.Close()
			log.Info("downloading backup", "backup", name, "location", location)
			path, b, st, err := snapshot.Fetch(ctx, client.New(conn), name, location, workDir, nil)
			if err != nil {
				return fmt.Errorf("backup %q: %w", name, err)
			}
			log.Info("backup verified", "backup", name, "sha256", b.GetSha256(), "revision", st.Revision, "keys", st.TotalKey)
			movedTo, err := snapshot.Restore(path, m)
			if movedTo != "" {
				log.Info("old data directory moved aside", "to", movedTo)
			}
			if err != nil {
				return err
			}
			_ = os.RemoveAll(workDir)
			log.Info("member data restored", "member", m.Name, "dataDir", m.DataDir)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&serverAddr, "server", "", "data server gRPC address")
	fl.StringVar(&name, "name", "", "backup to restore")
	fl.StringVar(&location, "location", "", "storage location (default: the server's default)")
	fl.StringVar(&workDir, "work-dir", "", "where the download is kept until restored (default: beside the data dir)")
	fl.StringVar(&m.DataDir, "data-dir", "", "the member's data directory")
	fl.StringVar(&m.Name, "member-name", "", "the member's name")
	fl.StringVar(&m.InitialCluster, "initial-cluster", "", "NAME=PEER-URL,... of every member")
	fl.StringSliceVar(&m.InitialAdvertisePeerURLs, "initial-advertise-peer-urls", nil, "this member's peer URLs")
	fl.StringVar(&m.InitialClusterToken, "initial-cluster-token", "", "the restored cluster's token")
	fl.BoolVar(&m.MoveAside, "move-aside", false, "rename a non-empty data directory instead of refusing")
	_ = cmd.MarkFlagRequired("server")
	return cmd
}
