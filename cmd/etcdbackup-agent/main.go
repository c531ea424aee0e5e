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
// mounts. The flags a Job sets are its kind's agentjob flags struct
// (agentjob.BackupFlags …), bound here under agentjob's flag names: the
// server writes them with the same struct. This file only parses flags
// and wires.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"filippo.io/age"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/restore"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
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

func newRoot() *cobra.Command { return commands{}.root() }

// commands builds the agent's command tree.
type commands struct {
	// parsed, when set, is given each command's Job flags once they are
	// parsed, and the command does not run: tests read what a Job's
	// arguments say to its agent.
	parsed func(agentjob.Flags)
}

func (c commands) root() *cobra.Command {
	root := &cobra.Command{
		Use:           "etcdbackup-agent",
		Short:         "The agents of kubectl-etcdbackup, one command per kind: backup, restore, drill, delta, fold and kit",
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(c.backup(), c.restore(), c.drill(), c.delta(), c.fold(), c.kit())
	return root
}

// runE is a command's RunE: run, once the flags are parsed into the
// struct flags returns, unless c.parsed takes them.
func (c commands) runE(flags func() agentjob.Flags, run func(cmd *cobra.Command) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if c.parsed != nil {
			c.parsed(flags())
			return nil
		}
		return run(cmd)
	}
}

func newLogger() *slog.Logger { return slog.New(slog.NewJSONHandler(os.Stderr, nil)) }

// serverFlags say how the agent reaches the server: its Job's
// (agentjob.Conn) and the name the server's certificate must hold.
type serverFlags struct {
	*agentjob.Conn
	name string
}

// dial connects to the server, over TLS verified with the server's CA
// when --server-ca is set, sending the token in --token-file (if any)
// with every call.
func dial(f serverFlags) (*grpc.ClientConn, *client.Client, error) {
	var opts []grpc.DialOption
	if f.ServerCA != "" {
		o, err := client.WithServerCA(f.ServerCA, f.name)
		if err != nil {
			return nil, nil, fmt.Errorf("--server-ca: %w", err)
		}
		opts = append(opts, o)
	}
	if f.TokenFile != "" {
		opts = append(opts, client.WithTokenFile(f.TokenFile))
	}
	conn, c, err := client.Dial(f.Server, opts...)
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

// addServerFlags binds how the agent reaches the server to conn, and
// makes --server required; it returns what dial needs.
func addServerFlags(cmd *cobra.Command, conn *agentjob.Conn, server string) serverFlags {
	f := serverFlags{Conn: conn}
	fl := cmd.Flags()
	fl.StringVar(&conn.Server, agentjob.FlagServer, "", server)
	fl.StringVar(&conn.TokenFile, agentjob.FlagTokenFile, "",
		"file holding the projected ServiceAccount token (audience etcdbackup) sent to the server; read again for every call, as the kubelet rotates it")
	fl.StringVar(&conn.ServerCA, agentjob.FlagServerCA, "",
		"CA certificate(s) the server's agent port must present a certificate of (the server's Jobs mount ConfigMap etcdbackup-agent-ca here); empty: plaintext, for a server's user API reached by port-forward")
	fl.StringVar(&f.name, "server-name", "", "name the server's certificate must hold (default: the host of --server)")
	_ = cmd.MarkFlagRequired(agentjob.FlagServer)
	return f
}

func (c commands) backup() *cobra.Command {
	var f agentjob.BackupFlags
	var etcd backup.Etcd
	cmd := &cobra.Command{
		Use:   "backup --endpoint URL --server HOST:PORT --name NAME",
		Short: "Stream a snapshot of one etcd member to the data server",
		Args:  cobra.NoArgs,
	}
	srv := addServerFlags(cmd, &f.Conn, "data server gRPC address, e.g. etcdbackup.etcdbackup-system.svc:50052")
	cmd.RunE = c.runE(func() agentjob.Flags { return f }, func(cmd *cobra.Command) error {
		ctx := cmd.Context()
		log := newLogger()
		if err := required(agentjob.FlagName, f.Name); err != nil {
			return err
		}
		opts := backup.Options{
			Name: f.Name, Location: f.Location, Target: f.Target, Compression: f.Compression, Labels: f.Labels,
			AgeRecipients: f.EncryptTo, ScratchDir: f.ScratchDir,
		}
		etcdClient, endpoint, err := withJobEtcd(etcd, f.Etcd).Connect(ctx)
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
	})
	fl := cmd.Flags()
	addEtcdFlags(fl, &etcd, &f.Etcd, "the etcd member to use, https://HOST:PORT (a snapshot is one member's state)",
		"the cluster's members; the agent snapshots a healthy follower, else the leader")
	fl.StringVar(&f.Name, agentjob.FlagName, "", "name of the backup")
	fl.StringVar(&f.Location, agentjob.FlagLocation, "", "storage location (default: the server's default)")
	fl.StringVar(&f.Target, agentjob.FlagTarget, "", "name of the etcd target, recorded with the backup")
	addEncodingFlags(fl, &f.Compression, &f.EncryptTo, "the backup")
	fl.StringToStringVar(&f.Labels, agentjob.FlagLabels, nil, "labels of the backup")
	fl.StringVar(&f.ScratchDir, agentjob.FlagScratchDir, "", "directory for a copy of the plain snapshot while it streams, from which its revision, keys and hash are read and recorded (as large as the database); empty records the member's revision only")
	return cmd
}

func (c commands) restore() *cobra.Command {
	var f agentjob.RestoreFlags
	cmd := &cobra.Command{
		Use:   "restore --server HOST:PORT --name NAME --data-dir DIR --member-name M --initial-cluster C --initial-advertise-peer-urls U",
		Short: "Download a backup through the data server and rebuild one etcd member's data directory",
		Args:  cobra.NoArgs,
	}
	srv := addServerFlags(cmd, &f.Conn, "data server gRPC address")
	cmd.RunE = c.runE(func() agentjob.Flags { return f }, func(cmd *cobra.Command) error {
		log := newLogger()
		if err := required(agentjob.FlagName, f.Name); err != nil {
			return err
		}
		if f.BumpRevision < 0 {
			return fmt.Errorf("--bump-revision %d is negative: give 0 to keep the snapshot's revisions, or a positive amount", f.BumpRevision)
		}
		o := member.Options{
			Name: f.Name, Location: f.Location, WorkDir: f.WorkDir, SHA256: f.SHA256,
			Member: snapshot.Member{
				DataDir: f.DataDir, Name: f.MemberName, InitialCluster: f.InitialCluster, InitialAdvertisePeerURLs: f.InitialAdvertisePeerURLs,
				InitialClusterToken: f.InitialClusterToken, MoveAside: f.MoveAside, BumpRevision: &f.BumpRevision,
			},
		}
		deltas, err := restoreDeltas(f)
		if err != nil {
			return err
		}
		o.Deltas = deltas
		if err := o.Validate(); err != nil {
			return err
		}
		ids, err := identitiesFrom(f.IdentityDir)
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
	})
	fl := cmd.Flags()
	fl.StringVar(&f.Name, agentjob.FlagName, "", "backup to restore")
	fl.StringVar(&f.Location, agentjob.FlagLocation, "", "storage location (default: the server's default)")
	fl.StringVar(&f.WorkDir, agentjob.FlagWorkDir, "", "where the download is kept until restored (default: beside the data dir)")
	fl.StringVar(&f.DataDir, agentjob.FlagDataDir, "", "the member's data directory")
	fl.StringVar(&f.MemberName, agentjob.FlagMemberName, "", "the member's name")
	fl.StringVar(&f.InitialCluster, agentjob.FlagInitialCluster, "", "NAME=PEER-URL,... of every member")
	fl.StringSliceVar(&f.InitialAdvertisePeerURLs, agentjob.FlagInitialAdvertisePeerURLs, nil, "this member's peer URLs")
	fl.StringVar(&f.InitialClusterToken, agentjob.FlagInitialClusterToken, "", "the restored cluster's token")
	fl.BoolVar(&f.MoveAside, agentjob.FlagMoveAside, false, "rename a non-empty data directory instead of refusing")
	fl.Int64Var(&f.BumpRevision, agentjob.FlagBumpRevision, snapshot.DefaultRevisionBump,
		"add this to etcd's revision and mark the result compacted, so that watchers and informers of the lost data relist; 0 keeps the snapshot's revisions. The same for every member")
	fl.StringVar(&f.IdentityDir, agentjob.FlagIdentityDir, "", "directory of age identity files (a mounted Secret) to decrypt an encrypted backup")
	fl.StringVar(&f.SHA256, agentjob.FlagSHA256, "", "SHA-256 (hex) the stored backup must have; any other content under the name is refused before it is restored")
	fl.Int64Var(&f.ToRevision, agentjob.FlagToRevision, 0, "restore to this etcd revision: replay the delta segments of --segments-file onto the backup up to it")
	fl.StringVar(&f.ToTime, agentjob.FlagToTime, "", "restore to the last revision seen at or before this RFC 3339 time (instead of --to-revision)")
	fl.Int64Var(&f.ToMinRevision, agentjob.FlagToMinRevision, 0, "with --to-time: replay at least to this revision, whatever the segments' times say (the server's plan sets it)")
	fl.StringVar(&f.SegmentsFile, agentjob.FlagSegmentsFile, "", "with --to-revision/--to-time: JSON list [{\"name\",\"sha256\"}] of the delta segments to replay, in order")
	fl.StringVar(&f.SegmentsSHA256, agentjob.FlagSegmentsSHA256, "", "SHA-256 (hex) --segments-file must have")
	fl.BoolVar(&f.AllowLeaseLoss, agentjob.FlagAllowLeaseLoss, false, "with --to-revision/--to-time: restore keys whose lease's TTL was never read with a short lease instead of refusing")
	return cmd
}

// addEtcdFlags adds the flags that say how to reach etcd, the same for
// every agent that reads it: a Job's (job) and the agent's own (etcd);
// endpoint and endpoints say what it does with the member it picks.
func addEtcdFlags(fl *pflag.FlagSet, etcd *backup.Etcd, job *agentjob.Etcd, endpoint, endpoints string) {
	fl.StringVar(&etcd.Endpoint, "endpoint", "", endpoint)
	fl.StringSliceVar(&job.Endpoints, agentjob.FlagEndpoints, nil, endpoints)
	fl.StringVar(&job.CACert, agentjob.FlagCACert, "", "CA bundle that signed etcd's serving certificate")
	fl.StringVar(&job.Cert, agentjob.FlagCert, "", "client certificate for etcd")
	fl.StringVar(&job.Key, agentjob.FlagKey, "", "client key for etcd")
	fl.BoolVar(&job.InsecurePlaintext, agentjob.FlagInsecurePlaintext, false, "allow an http:// endpoint (no TLS); only when explicitly asked for")
	fl.BoolVar(&etcd.InsecureSkipVerify, "insecure-skip-tls-verify", false, "do not verify etcd's serving certificate")
	fl.DurationVar(&etcd.DialTimeout, "dial-timeout", 10*time.Second, "how long to wait for etcd")
}

// withJobEtcd is etcd with what the Job says of reaching it.
func withJobEtcd(etcd backup.Etcd, job agentjob.Etcd) backup.Etcd {
	etcd.Endpoints, etcd.CACert, etcd.Cert, etcd.Key, etcd.InsecurePlaintext = job.Endpoints, job.CACert, job.Cert, job.Key, job.InsecurePlaintext
	return etcd
}

// addEncodingFlags adds how what an agent stores is encoded.
func addEncodingFlags(fl *pflag.FlagSet, compression *string, encryptTo *[]string, what string) {
	fl.StringVar(compression, agentjob.FlagCompression, "", "\"zstd\" to compress "+what+", empty for none")
	fl.StringArrayVar(encryptTo, agentjob.FlagEncryptTo, nil, "age public key (age1...) to encrypt "+what+" to, after compression; repeatable")
}

// writeReport writes an agent's report where the server reads it (its
// --result-file: the pod's termination message).
func writeReport(path string, r agentjob.Report) error {
	b, err := r.Encode()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("--result-file: %w", err)
	}
	return nil
}

// required refuses a run whose required flags, given as name and value
// pairs, are empty, naming those that are.
func required(namesAndValues ...string) error {
	var missing []string
	for i := 0; i+1 < len(namesAndValues); i += 2 {
		if namesAndValues[i+1] == "" {
			missing = append(missing, "--"+namesAndValues[i])
		}
	}
	switch n := len(missing); n {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%s is required", missing[0])
	default:
		return fmt.Errorf("%s and %s are required", strings.Join(missing[:n-1], ", "), missing[n-1])
	}
}
