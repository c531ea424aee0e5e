// Command etcdbackup-agent runs in the cluster as a Job the data server
// creates: `backup` snapshots one etcd member into the server (package
// agents/backup), `restore` rebuilds one member's data directory from a
// backup fetched through the server (package agents/restore), `drill`
// checks that a backup restores (package agents/drill), `delta` stores
// every etcd revision as a chain's delta segments while it holds the
// target's delta Lease (package agents/delta), `fold` compacts a delta
// chain into a new full backup (package agents/fold). It talks to the
// server by its in-cluster Service address and never sees storage
// credentials; etcd's client certificates come from files a Secret
// mounts. This file only parses flags and wires.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"filippo.io/age"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/restore"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		if errors.Is(err, errDrillFailed) || errors.Is(err, errFoldFailed) {
			os.Exit(exitDrillFailed)
		}
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
	root.AddCommand(newBackupCmd(), newRestoreCmd(), newDrillCmd(), newDeltaCmd(), newFoldCmd())
	return root
}

func newLogger() *slog.Logger { return slog.New(slog.NewJSONHandler(os.Stderr, nil)) }

// serverFlags say how the agent reaches the server.
type serverFlags struct {
	addr, tokenFile, ca, name string
}

// dial connects to the server, over TLS verified with the server's CA
// when --server-ca is set, sending the token in --token-file (if any)
// with every call.
func dial(f serverFlags) (*grpc.ClientConn, *client.Client, error) {
	var opts []grpc.DialOption
	if f.ca != "" {
		o, err := client.WithServerCA(f.ca, f.name)
		if err != nil {
			return nil, nil, fmt.Errorf("--server-ca: %w", err)
		}
		opts = append(opts, o)
	}
	if f.tokenFile != "" {
		opts = append(opts, client.WithTokenFile(f.tokenFile))
	}
	serverAddr := f.addr
	conn, c, err := client.Dial(serverAddr, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("--server: %w", err)
	}
	return conn, c, nil
}

// identitiesFrom reads the age identities of --identity-dir (a mounted
// Secret); none when dir is "".
func identitiesFrom(dir string) ([]age.Identity, error) {
	if dir == "" {
		return nil, nil
	}
	ids, err := crypt.ReadIdentityDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--identity-dir: %w", err)
	}
	return ids, nil
}

// optionalIdentities reads the identities in the volume of an optional
// identity Secret (drill and fold Jobs): a missing Secret leaves it
// empty. A plain backup needs none; an encrypted one gets no verdict,
// which says why (problem).
func optionalIdentities(log *slog.Logger, dir, what string) (ids []age.Identity, problem string) {
	ids, err := identitiesFrom(dir)
	if err != nil {
		log.Warn(what+" identities unreadable", "error", err.Error())
		return nil, err.Error()
	}
	return ids, ""
}

func addServerFlags(cmd *cobra.Command, f *serverFlags) {
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "",
		"file holding the projected ServiceAccount token (audience etcdbackup) sent to the server; read again for every call, as the kubelet rotates it")
	cmd.Flags().StringVar(&f.ca, "server-ca", "",
		"CA certificate(s) the server's agent port must present a certificate of (the server's Jobs mount ConfigMap etcdbackup-agent-ca here); empty: plaintext, for a server's user API reached by port-forward")
	cmd.Flags().StringVar(&f.name, "server-name", "", "name the server's certificate must hold (default: the host of --server)")
}

func newBackupCmd() *cobra.Command {
	var etcd backup.Etcd
	var srv serverFlags
	opts := backup.Options{}
	cmd := &cobra.Command{
		Use:   "backup --endpoint URL --server HOST:PORT --name NAME",
		Short: "Stream a snapshot of one etcd member to the data server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := newLogger()
			if opts.Name == "" {
				return errors.New("--name is required")
			}
			etcdClient, endpoint, err := etcd.Connect(ctx)
			if err != nil {
				return err
			}
			defer etcdClient.Close()
			conn, up, err := dial(srv)
			if err != nil {
				return err
			}
			defer conn.Close()
			opts.Endpoint = endpoint
			log.Info("snapshot starting", "endpoint", endpoint, "backup", opts.Name, "location", opts.Location, "compression", opts.Compression,
				"encryptedTo", len(opts.AgeRecipients))
			start := time.Now()
			b, err := backup.Run(ctx, etcdClient, up, opts)
			if err != nil {
				log.Error("backup failed", "backup", opts.Name, "error", err.Error())
				return err
			}
			// No SHA-256 in the log: a backup's hash pins restores to it,
			// and logs are read by more people than backups are.
			log.Info("backup stored", "backup", b.GetName(), "location", b.GetLocation(), "size", b.GetSize(),
				"rawSize", b.GetRawSize(), "revision", b.GetEtcd().GetRevision(), "seconds", time.Since(start).Seconds())
			return nil
		},
	}
	fl := cmd.Flags()
	addEtcdFlags(fl, &etcd, "the etcd member to use, https://HOST:PORT (a snapshot is one member's state)",
		"the cluster's members; the agent snapshots a healthy follower, else the leader")
	fl.StringVar(&srv.addr, "server", "", "data server gRPC address, e.g. etcdbackup.etcdbackup-system.svc:50052")
	fl.StringVar(&opts.Name, "name", "", "name of the backup")
	fl.StringVar(&opts.Location, "location", "", "storage location (default: the server's default)")
	fl.StringVar(&opts.Target, "target", "", "name of the etcd target, recorded with the backup")
	fl.StringVar(&opts.Compression, "compression", "", "\"zstd\" to compress, empty for none")
	fl.StringToStringVar(&opts.Labels, "labels", nil, "labels of the backup")
	fl.StringArrayVar(&opts.AgeRecipients, "encrypt-to", nil, "age public key (age1...) to encrypt the backup to, after compression; repeatable")
	fl.StringVar(&opts.ScratchDir, "scratch-dir", "", "directory for a copy of the plain snapshot while it streams, from which its revision, keys and hash are read and recorded (as large as the database); empty records the member's revision only")
	addServerFlags(cmd, &srv)
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

func newRestoreCmd() *cobra.Command {
	var srv serverFlags
	var identityDir string
	var o member.Options
	var bump int64
	var point pointFlags
	cmd := &cobra.Command{
		Use:   "restore --server HOST:PORT --name NAME --data-dir DIR --member-name M --initial-cluster C --initial-advertise-peer-urls U",
		Short: "Download a backup through the data server and rebuild one etcd member's data directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger()
			if o.Name == "" {
				return errors.New("--name is required")
			}
			if bump < 0 {
				return fmt.Errorf("--bump-revision %d is negative: give 0 to keep the snapshot's revisions, or a positive amount", bump)
			}
			o.Member.BumpRevision = &bump
			deltas, err := point.deltas()
			if err != nil {
				return err
			}
			o.Deltas = deltas
			if err := o.Validate(); err != nil {
				return err
			}
			ids, err := identitiesFrom(identityDir)
			if err != nil {
				// The Secret's volume is optional (server/jobs): a missing
				// Secret is an empty directory here.
				return fmt.Errorf("%w: the Secret named by `restore --identity-secret` is missing from the members' namespace or holds no age identity file; "+
					"nothing was restored: create it (kubectl -n NAMESPACE create secret generic NAME --from-file=identity.txt=KEYFILE) and run the restore again", err)
			}
			o.Identities = ids
			conn, c, err := dial(srv)
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = restore.Run(cmd.Context(), c, o, log)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&srv.addr, "server", "", "data server gRPC address")
	fl.StringVar(&o.Name, "name", "", "backup to restore")
	fl.StringVar(&o.Location, "location", "", "storage location (default: the server's default)")
	fl.StringVar(&o.WorkDir, "work-dir", "", "where the download is kept until restored (default: beside the data dir)")
	fl.StringVar(&o.Member.DataDir, "data-dir", "", "the member's data directory")
	fl.StringVar(&o.Member.Name, "member-name", "", "the member's name")
	fl.StringVar(&o.Member.InitialCluster, "initial-cluster", "", "NAME=PEER-URL,... of every member")
	fl.StringSliceVar(&o.Member.InitialAdvertisePeerURLs, "initial-advertise-peer-urls", nil, "this member's peer URLs")
	fl.StringVar(&o.Member.InitialClusterToken, "initial-cluster-token", "", "the restored cluster's token")
	fl.BoolVar(&o.Member.MoveAside, "move-aside", false, "rename a non-empty data directory instead of refusing")
	fl.Int64Var(&bump, "bump-revision", snapshot.DefaultRevisionBump,
		"add this to etcd's revision and mark the result compacted, so that watchers and informers of the lost data relist; 0 keeps the snapshot's revisions. The same for every member")
	fl.StringVar(&identityDir, "identity-dir", "", "directory of age identity files (a mounted Secret) to decrypt an encrypted backup")
	fl.StringVar(&o.SHA256, "sha256", "", "SHA-256 (hex) the stored backup must have; any other content under the name is refused before it is restored")
	fl.Int64Var(&point.toRevision, "to-revision", 0, "restore to this etcd revision: replay the delta segments of --segments-file onto the backup up to it")
	fl.StringVar(&point.toTime, "to-time", "", "restore to the last revision seen at or before this RFC 3339 time (instead of --to-revision)")
	fl.Int64Var(&point.toMinRevision, "to-min-revision", 0, "with --to-time: replay at least to this revision, whatever the segments' times say (the server's plan sets it)")
	fl.StringVar(&point.segmentsFile, "segments-file", "", "with --to-revision/--to-time: JSON list [{\"name\",\"sha256\"}] of the delta segments to replay, in order")
	fl.StringVar(&point.segmentsSHA256, "segments-sha256", "", "SHA-256 (hex) --segments-file must have")
	fl.BoolVar(&point.allowLeaseLoss, "allow-lease-loss", false, "with --to-revision/--to-time: restore keys whose lease's TTL was never read with a short lease instead of refusing")
	addServerFlags(cmd, &srv)
	_ = cmd.MarkFlagRequired("server")
	return cmd
}

// addEtcdFlags adds the flags that say how to reach etcd, the same for
// every agent that reads it; endpoint and endpoints say what it does with
// the member it picks.
func addEtcdFlags(fl *pflag.FlagSet, etcd *backup.Etcd, endpoint, endpoints string) {
	fl.StringVar(&etcd.Endpoint, "endpoint", "", endpoint)
	fl.StringSliceVar(&etcd.Endpoints, "endpoints", nil, endpoints)
	fl.StringVar(&etcd.CACert, "cacert", "", "CA bundle that signed etcd's serving certificate")
	fl.StringVar(&etcd.Cert, "cert", "", "client certificate for etcd")
	fl.StringVar(&etcd.Key, "key", "", "client key for etcd")
	fl.BoolVar(&etcd.InsecurePlaintext, "insecure-plaintext", false, "allow an http:// endpoint (no TLS); only when explicitly asked for")
	fl.BoolVar(&etcd.InsecureSkipVerify, "insecure-skip-tls-verify", false, "do not verify etcd's serving certificate")
	fl.DurationVar(&etcd.DialTimeout, "dial-timeout", 10*time.Second, "how long to wait for etcd")
}
