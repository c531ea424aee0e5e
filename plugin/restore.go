package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// RestoreOptions are the options of `kubectl etcdbackup restore`.
type RestoreOptions struct {
	*GlobalOptions
	Name string

	Local    bool
	FromFile string
	Member   snapshot.Member
	WorkDir  string
	Target   string
	Wait     bool
	DryRun   bool
}

// NewCmdRestore returns the restore command.
func NewCmdRestore(g *GlobalOptions) *cobra.Command {
	o := &RestoreOptions{GlobalOptions: g}
	cmd := &cobra.Command{
		Use:   "restore NAME (--local --data-dir DIR --member-name M --initial-cluster C --initial-advertise-peer-urls U | --target T)",
		Short: "Rebuild etcd member data from a backup",
		Long: `With --local, restore downloads the backup through the API server, checks
its SHA-256 and etcd's own hash, and rebuilds an etcd member's data directory
on this machine with etcd's own restore code — what an operator does on a
kubeadm control-plane node to recover from losing etcd. Run it once per
member, with that member's name and peer URLs and the same --initial-cluster.

A data directory that is not empty is refused unless --move-aside is given,
which renames it to DIR.before-restore-TIMESTAMP; nothing is ever deleted.`,
		Example: `  kubectl etcdbackup restore control-plane-20260131-020000 --local \
      --data-dir /var/lib/etcd --member-name cp-1 \
      --initial-cluster cp-1=https://10.0.0.10:2380,cp-2=https://10.0.0.11:2380,cp-3=https://10.0.0.12:2380 \
      --initial-advertise-peer-urls https://10.0.0.10:2380`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.Local, "local", false, "restore into a data directory on this machine")
	f.StringVar(&o.Member.DataDir, "data-dir", "", "with --local: the member's etcd --data-dir")
	f.StringVar(&o.Member.Name, "member-name", "", "with --local: the member's etcd --name")
	f.StringVar(&o.Member.InitialCluster, "initial-cluster", "", "with --local: NAME=PEER-URL,... of every member")
	f.StringSliceVar(&o.Member.InitialAdvertisePeerURLs, "initial-advertise-peer-urls", nil, "with --local: this member's peer URLs")
	f.StringVar(&o.Member.InitialClusterToken, "initial-cluster-token", "", "with --local: the restored cluster's token (default etcd's \"etcd-cluster\")")
	f.BoolVar(&o.Member.MoveAside, "move-aside", false, "rename a non-empty data directory instead of refusing")
	f.StringVar(&o.FromFile, "from-file", "", "with --local: restore from a file `download` wrote earlier instead of downloading (when the API server is down)")
	f.StringVar(&o.WorkDir, "work-dir", "", "where the download is kept until restored (default: beside the data directory)")
	f.StringVar(&o.Target, "target", "", "restore the members of this etcd target in the cluster")
	f.BoolVar(&o.Wait, "wait", false, "with --target: wait until every member's data is rebuilt")
	f.BoolVar(&o.DryRun, "dry-run", false, "print what would be done, change nothing")
	return cmd
}

// Validate checks the flags before anything is downloaded.
func (o *RestoreOptions) Validate() error {
	switch {
	case o.Local && o.Target != "":
		return errors.New("give --local or --target, not both")
	case !o.Local && o.Target == "":
		return errors.New("say where to restore: --local (with --data-dir, --member-name, --initial-cluster, --initial-advertise-peer-urls) or --target")
	case o.FromFile != "" && !o.Local:
		return errors.New("--from-file goes with --local")
	case o.Local:
		if err := o.Member.Validate(); err != nil {
			return fmt.Errorf("%w (flags --data-dir, --member-name, --initial-cluster, --initial-advertise-peer-urls)", err)
		}
		return snapshot.CheckDataDir(o.Member)
	}
	return nil
}

// Run restores.
func (o *RestoreOptions) Run(ctx context.Context) error {
	if !o.Local {
		return fmt.Errorf("in-cluster restore (--target) is not available from this server yet; restore each member with --local on its node")
	}
	dataDir, err := filepath.Abs(o.Member.DataDir)
	if err != nil {
		return err
	}
	o.Member.DataDir = dataDir
	work := o.WorkDir
	if work == "" {
		work = filepath.Join(filepath.Dir(dataDir), ".etcdbackup-restore-"+o.Name)
	}
	if o.DryRun {
		fmt.Fprintf(o.Out, "would download backup %q to %s, verify it, and rebuild %s for member %q of cluster %s (peer URLs %s)\n",
			o.Name, work, dataDir, o.Member.Name, o.Member.InitialCluster, strings.Join(o.Member.InitialAdvertisePeerURLs, ","))
		return nil
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	if o.FromFile != "" {
		return o.restoreFile(work)
	}
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var bar *progress
	path, b, st, err := snapshot.Fetch(ctx, conn.Client, o.Name, o.Location, work, func(done, total int64) {
		if bar == nil {
			bar = newProgress(o.ErrOut, total, "downloading "+o.Name)
		}
		bar.Set(done)
	})
	bar.Finish(err == nil)
	if errors.Is(err, snapshot.ErrCorrupt) {
		return fmt.Errorf("backup %q is corrupt, refusing to restore it: %v", o.Name, err)
	}
	if err != nil {
		return conn.explain("download "+quote(o.Name), err)
	}
	fmt.Fprintf(o.ErrOut, "backup %q verified: sha256 %s, revision %d, %d keys\n", o.Name, b.GetSha256(), st.Revision, st.TotalKey)
	return o.restore(path, work)
}

// restoreFile restores from a file downloaded earlier; it may still be
// zstd-compressed as stored.
func (o *RestoreOptions) restoreFile(work string) error {
	path, err := snapshot.Unpack(o.FromFile, work)
	if err != nil {
		return err
	}
	st, err := snapshot.Check(path)
	if err != nil {
		return fmt.Errorf("%s is not a usable etcd snapshot, refusing to restore it: %v", o.FromFile, err)
	}
	fmt.Fprintf(o.ErrOut, "%s verified: etcd trailer and database consistent, revision %d, %d keys\n", o.FromFile, st.Revision, st.TotalKey)
	return o.restore(path, work)
}

func (o *RestoreOptions) restore(path, work string) error {
	movedTo, err := snapshot.Restore(path, o.Member)
	if movedTo != "" {
		fmt.Fprintf(o.ErrOut, "the old data directory was moved to %s\n", movedTo)
	}
	if err != nil {
		return err
	}
	os.RemoveAll(work)
	fmt.Fprintf(o.Out, "restored %q into %s for member %q; start etcd with --data-dir %s --name %s --initial-cluster %s --initial-advertise-peer-urls %s\n",
		o.Name, o.Member.DataDir, o.Member.Name, o.Member.DataDir, o.Member.Name, o.Member.InitialCluster, strings.Join(o.Member.InitialAdvertisePeerURLs, ","))
	return nil
}
