package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// RestoreOptions are the options of `kubectl etcdbackup restore`.
type RestoreOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	Name       string

	Local    bool
	FromFile string
	// IdentityFiles decrypt an encrypted backup with --local;
	// IdentitySecret names the Secret the restore Jobs mount with --target.
	IdentityFiles  []string
	IdentitySecret string
	Member         snapshot.Member
	// BumpRevision is --bump-revision: added to etcd's revision, which is
	// then marked compacted (0: neither). Complete gives it to Member.
	BumpRevision int64
	WorkDir      string
	Target       string
	DryRun       bool
	WaitOptions
	// ToRevision and ToTime (--to-revision, --to-time) restore to a
	// point: the newest full backup before it and the delta segments
	// after that full, replayed up to it. AllowLeaseLoss is
	// --allow-lease-loss.
	ToRevision     int64
	ToTime         string
	AllowLeaseLoss bool
	point          delta.Point
	// segments and plannedRevision are the server's plan of an in-cluster
	// restore to a point (plannedRevision 0 when only replay can tell).
	segments        []string
	plannedRevision int64
	// Rebuild is --rebuild and its flags; rebuilding is set while one
	// restores etcd's member (the kubelet, not the operator, starts it).
	Rebuild    RebuildOptions
	rebuilding bool
	// now is the clock a restore's elapsed time is read from (time.Now;
	// tests give their own, so that the durations printed are exact).
	// start is Run's first reading, steps where each step ended so far:
	// a restore is the operator's recovery time, printed at its end.
	now   func() time.Time
	start time.Time
	steps []restoreStep
}

// restoreStep is a step of a restore and when it ended; it began where
// the step before it ended (the first at the start of Run).
type restoreStep struct {
	name string
	end  time.Time
}

// NewCmdRestore returns the restore command.
func NewCmdRestore(g *GlobalOptions) *cobra.Command {
	return newCmdRestore(&RestoreOptions{GlobalOptions: g, now: time.Now})
}

// newCmdRestore is the restore command running o, whose clock a test may
// have set.
func newCmdRestore(o *RestoreOptions) *cobra.Command {
	g := o.GlobalOptions
	o.PrintFlags, o.WaitOptions = newPrintFlags(plainFormats), defaultWait()
	cmd := &cobra.Command{
		Use:   "restore NAME (--target T | --local --data-dir DIR --member-name M --initial-cluster C --initial-advertise-peer-urls U)",
		Short: "Rebuild etcd member data from a backup",
		Long: `With --target, the server rebuilds every member of one of its etcd targets
in the cluster: it starts one restore agent Job per member, each writing into
that member's volume as the server's configuration names it (a
PersistentVolumeClaim, or a host path on the member's node). The restore is
refused while any member still answers: stop them first (scale the
StatefulSet or Deployment to 0), restore with --wait, then start them again.
--dry-run prints the plan and changes nothing.

With --to-revision R or --to-time T (for targets with deltas:), the backup is
picked for you: the newest full backup of the target at or before the point
whose delta chain reaches it (NAME, if given, names that full backup). Every
member's Job restores it, replays the delta segments after it up to the
point, then restores the result. With --target the server plans and the Jobs
do the work; with --local, this machine does, one member at a time.

With --local, restore downloads the backup through the API server, checks
its SHA-256 and etcd's own hash, and rebuilds an etcd member's data directory
on this machine with etcd's own restore code — what an operator does on a
kubeadm control-plane node to recover from losing etcd. Run it once per
member, with that member's name and peer URLs and the same --initial-cluster.

With --local --rebuild, a lost control-plane node comes back from the
backup and its recovery kit (a target's kit: in the server's
configuration): the kit is opened here with --identity and checked, the
node's kubelet must be of the kit's Kubernetes version, then the kit's
files (PKI, encryption configuration, kubeconfigs) are written under --root,
etcd's member is rebuilt from the backup as its static pod's manifest
describes it, and the static-pod manifests are written last, so that the
kubelet starts the control plane on restored data. What is in the way is
renamed aside, never deleted; --dry-run prints every file it would write.

A restore that completes ends with its recovery time, from the command's
start ("restored in 1m23s: download 41s, verify 6s, rebuild 36s", each
step's part; with --target --wait the whole, on stderr with -o json/yaml).

A data directory that is not empty is refused unless --move-aside is given,
which renames it to DIR.before-restore-TIMESTAMP; nothing is ever deleted.

Every restore adds --bump-revision (default 1000000000, etcd's
recommendation) to etcd's revision and marks the new revision compacted, as
etcd's recovery guide for Kubernetes says: kube-apiserver's watch cache,
informers and kubelets hold resourceVersions of the lost data, newer than
the backup's; bumped past them and compacted, every watch from before the
restore ends as compacted and its client relists instead of keeping stale
objects. --bump-revision 0 keeps the snapshot's revisions (for an etcd whose
clients need them as they were). Give every member the same value.

An age-encrypted backup needs a secret key of one of its recipients: with
--local, --identity KEYFILE (or $ETCDBACKUP_AGE_IDENTITY); with --target,
--identity-secret NAME, a Secret you create in the members' namespace
(kubectl -n NS create secret generic NAME --from-file=identity=KEYFILE). It is
mounted only into the restore Jobs; the server never reads it.`,
		Example: examples(`
# Show which Job would rebuild which member of target app-etcd; change nothing
kubectl etcdbackup restore app-etcd-20260131-020000 --target app-etcd --dry-run

# Rebuild every member of target app-etcd in the cluster and wait until done
kubectl etcdbackup restore app-etcd-20260131-020000 --target app-etcd --wait

# Rebuild target app-etcd as it was at 14:05 UTC, from its backups and deltas
kubectl etcdbackup restore --target app-etcd --to-time 2026-01-31T14:05:00Z --wait

# Rebuild member cp-1's data directory on this control-plane node
kubectl etcdbackup restore control-plane-20260131-020000 --local \
    --data-dir /var/lib/etcd --member-name cp-1 \
    --initial-cluster cp-1=https://10.0.0.10:2380,cp-2=https://10.0.0.11:2380,cp-3=https://10.0.0.12:2380 \
    --initial-advertise-peer-urls https://10.0.0.10:2380

# Bring back a lost control-plane node, the API server down: the kit's files,
# etcd's member, then the static-pod manifests (first with --dry-run)
KUBECONFIG=/dev/null kubectl etcdbackup restore control-plane-20260131-020000 --local --rebuild \
    --storage-config etcdbackup-storage.yaml --identity kit-key.txt

# Rebuild target app-etcd from an encrypted backup, the key in Secret etcd-age-key
kubectl etcdbackup restore app-etcd-20260131-020000 --target app-etcd --identity-secret etcd-age-key --wait`),
		Args:              cobra.RangeArgs(0, 1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	f := cmd.Flags()
	f.Int64Var(&o.ToRevision, "to-revision", 0, "restore the keyspace as it was at etcd revision `R`: the newest full backup at or before it, then its delta segments replayed up to R (targets with deltas:); NAME may then be left out")
	f.StringVar(&o.ToTime, "to-time", "", "restore the keyspace as it was at `TIME` (RFC 3339, e.g. 2026-12-02T14:05:00Z): the last revision seen at or before it")
	f.BoolVar(&o.AllowLeaseLoss, "allow-lease-loss", false, "with --to-revision/--to-time: restore keys whose lease expired before the delta agent could read its TTL, with a 60 s lease, instead of refusing")
	f.BoolVar(&o.Local, "local", false, "restore into a data directory on this machine")
	f.StringVar(&o.Member.DataDir, "data-dir", "", "with --local: the member's etcd --data-dir")
	f.StringVar(&o.Member.Name, "member-name", "", "with --local: the member's etcd --name")
	f.StringVar(&o.Member.InitialCluster, "initial-cluster", "", "with --local: NAME=PEER-URL,... of every member")
	f.StringSliceVar(&o.Member.InitialAdvertisePeerURLs, "initial-advertise-peer-urls", nil, "with --local: this member's peer URLs")
	f.StringVar(&o.Member.InitialClusterToken, "initial-cluster-token", "", "with --local: the restored cluster's token (default etcd's \"etcd-cluster\")")
	f.BoolVar(&o.Member.MoveAside, "move-aside", false, "rename a non-empty data directory instead of refusing")
	f.Int64Var(&o.BumpRevision, "bump-revision", snapshot.DefaultRevisionBump,
		"add `N` to etcd's revision and mark it compacted, so that watch caches, informers and kubelets relist instead of keeping the lost data's resourceVersions; 0 keeps the snapshot's revisions. The same for every member")
	f.StringVar(&o.FromFile, "from-file", "", "with --local: restore from `FILE`, written earlier by download, instead of downloading (when the API server is down)")
	f.StringVar(&o.WorkDir, "work-dir", "", "where the download is kept until restored (default: beside the data directory)")
	f.StringVar(&o.Target, "target", "", "restore the members of this etcd target in the cluster")
	_ = cmd.RegisterFlagCompletionFunc("target", completeServerInfo(g, targetNamesOf))
	o.WaitOptions.addFlags(f, "with --target: wait until every member's data is rebuilt, printing each member's phase changes on stderr")
	f.BoolVar(&o.DryRun, "dry-run", false, "print what would be done, change nothing")
	addIdentityFlag(cmd, &o.IdentityFiles, "an encrypted backup (with --local)")
	addStorageConfigFlag(cmd, g)
	f.StringVar(&o.IdentitySecret, "identity-secret", "", "with --target: `SECRET` in the members' namespace holding the age identity of an encrypted backup, mounted only into the restore Jobs")
	o.Rebuild.addFlags(f)
	o.PrintFlags.AddFlags(cmd, "output format (with --target)")
	return cmd
}

// Complete takes the backup's name from the arguments and gives
// --bump-revision to the member layout.
func (o *RestoreOptions) Complete(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		o.Name = backupName(args[0])
	}
	o.Member.BumpRevision = &o.BumpRevision
	o.point = delta.Point{Revision: o.ToRevision}
	if o.ToTime != "" {
		t, err := time.Parse(time.RFC3339Nano, o.ToTime)
		if err != nil {
			return fmt.Errorf("--to-time %q is not a time in RFC 3339 (like 2026-12-02T14:05:00Z or 2026-12-02T15:05:00+01:00)", o.ToTime)
		}
		o.point.Time = t
	}
	return nil
}

// toPoint says whether the restore is to a point rather than a backup.
func (o *RestoreOptions) toPoint() bool { return o.ToRevision != 0 || o.ToTime != "" }

// Validate checks that the flags go together; it reads nothing, so the
// data directory is checked in Run.
func (o *RestoreOptions) Validate() error {
	var storageConfig string
	if o.GlobalOptions != nil {
		storageConfig = o.StorageConfig
	}
	switch {
	case o.Name == "" && !o.toPoint():
		return errors.New("say what to restore: a backup NAME, or --to-revision R / --to-time TIME with --target T")
	case o.Name == "" && o.Target == "":
		return errors.New("--to-revision and --to-time without a backup NAME need --target T: the point is found among that target's backups")
	case o.ToRevision < 0:
		return fmt.Errorf("--to-revision %d: etcd revisions are positive", o.ToRevision)
	case o.ToRevision != 0 && o.ToTime != "":
		return errors.New("give --to-revision or --to-time, not both")
	case o.toPoint() && o.FromFile != "":
		return errors.New("--from-file restores one downloaded backup; a restore to a point (--to-revision, --to-time) reads the delta segments through the server or --storage-config")
	case o.AllowLeaseLoss && !o.toPoint():
		return errors.New("--allow-lease-loss goes with --to-revision or --to-time")
	case o.BumpRevision < 0:
		return fmt.Errorf("--bump-revision %d is negative: etcd's revision only grows; give 0 to keep the snapshot's revisions, or a positive amount (default %d)", o.BumpRevision, snapshot.DefaultRevisionBump)
	case o.Local && o.Target != "" && !o.toPoint():
		return errors.New("give --local or --target, not both (with --to-revision or --to-time, --target only says whose backups)")
	case !o.Local && o.Target == "":
		return errors.New("say where to restore: --local (with --data-dir, --member-name, --initial-cluster, --initial-advertise-peer-urls) or --target")
	case o.FromFile != "" && !o.Local:
		return errors.New("--from-file goes with --local")
	case storageConfig != "" && !o.Local:
		return errors.New("--storage-config reads a backup on this machine: it goes with --local (an in-cluster restore asks the data server)")
	case storageConfig != "" && o.FromFile != "":
		return errors.New("--storage-config and --from-file both say where the backup comes from: give one")
	case o.Target != "" && !o.Local && (o.Member.DataDir != "" || o.Member.Name != "" || o.Member.InitialCluster != "" || len(o.Member.InitialAdvertisePeerURLs) > 0 || o.Member.InitialClusterToken != "" || o.WorkDir != ""):
		return errors.New("with --target the members' layout comes from the server's configuration: drop --data-dir, --member-name, --initial-cluster, --initial-advertise-peer-urls, --initial-cluster-token and --work-dir")
	case o.Wait && o.Target == "":
		return errors.New("--wait goes with --target")
	case o.IdentitySecret != "" && o.Target == "":
		return errors.New("--identity-secret goes with --target; with --local pass --identity KEYFILE")
	case len(o.IdentityFiles) > 0 && !o.Local:
		return errors.New("--identity goes with --local: the key stays on this machine; with --target name a Secret in the members' namespace with --identity-secret")
	case o.Local && !o.PrintFlags.Human():
		return errors.New("-o goes with --target; --local prints what it did for a person")
	case o.Rebuild.Rebuild || o.Rebuild.Root != "/" && o.Rebuild.Root != "":
		return o.validateRebuild()
	case o.Local:
		if err := o.Member.Validate(); err != nil {
			return fmt.Errorf("%w (flags --data-dir, --member-name, --initial-cluster, --initial-advertise-peer-urls)", err)
		}
	}
	if o.PrintFlags != nil {
		return o.PrintFlags.Validate()
	}
	return nil
}

// Run restores. With --local a data directory that is not empty is
// refused first, before anything is downloaded, and even for --dry-run.
func (o *RestoreOptions) Run(ctx context.Context) error {
	o.start, o.steps = o.clock(), nil
	if o.Rebuild.Rebuild {
		return o.rebuild(ctx)
	}
	if !o.Local {
		return o.runTarget(ctx)
	}
	if err := snapshot.CheckDataDir(o.Member); err != nil {
		return err
	}
	dataDir, err := filepath.Abs(o.Member.DataDir)
	if err != nil {
		return err
	}
	o.Member.DataDir = dataDir
	work := o.WorkDir
	if work == "" {
		work = member.DefaultWorkDir(dataDir, cmp.Or(o.Name, "to-point"))
	}
	if o.DryRun && o.toPoint() {
		return o.restoreLocal(ctx, nil, work)
	}
	if o.DryRun {
		fmt.Fprintf(o.Out, "would download backup %q to %s, verify it, and rebuild %s for member %q of cluster %s (peer URLs %s)\n",
			o.Name, work, dataDir, o.Member.Name, o.Member.InitialCluster, strings.Join(o.Member.InitialAdvertisePeerURLs, ","))
		fmt.Fprintf(o.Out, "after restoring: %s\n", bumpSummary(o.Member.RevisionBump()))
		return nil
	}
	return o.restoreLocal(ctx, nil, work)
}

// restoreLocal runs the restore agent's own flow (package member) on this
// machine — fetch (or --from-file), verify, rebuild o.Member's data
// directory — reporting to the terminal where the agent logs; through
// conn, else a connection of its own.
func (o *RestoreOptions) restoreLocal(ctx context.Context, conn *Connection, work string) error {
	ids, err := loadIdentities(o.IdentityFiles)
	if err != nil {
		return err
	}
	var c *client.Client
	var deltas *member.Deltas
	var sha string
	if conn != nil {
		c = conn.Client
	} else if o.FromFile == "" {
		if conn, err = o.Connect(ctx); err != nil {
			return err
		}
		defer conn.Close()
		c = conn.Client
		if o.toPoint() {
			if deltas, sha, err = o.planPoint(ctx, conn); err != nil || o.DryRun {
				return err
			}
		} else if o.Location, err = o.resolveLocation(ctx, conn, "restore "+quote(o.Name), o.Name); err != nil {
			return err
		}
	}
	var bar *progress
	downloaded := false
	ev := member.Events{
		Downloading: func(done, total int64) {
			if bar == nil {
				bar = newProgress(o.ErrOut, total, "downloading "+o.Name)
			}
			bar.Set(done)
			// The last stored byte: what follows (decrypting,
			// decompressing, etcd's checks) is verifying.
			if !downloaded && total > 0 && done >= total {
				downloaded = true
				o.endStep("download")
			}
		},
		Verified: func(v member.Verified) {
			bar.Finish(true)
			bar = nil
			if o.FromFile == "" && !downloaded {
				// Nothing was left to download (a rerun resumed a
				// complete one): the time went to checking it.
				o.steps = append(o.steps, restoreStep{"download", o.lastEnd()})
			}
			o.endStep("verify")
			if v.File != "" {
				fmt.Fprintf(o.ErrOut, "%s verified: etcd trailer and database consistent, revision %d, %d keys\n", v.File, v.Status.Revision, v.Status.TotalKey)
				return
			}
			fmt.Fprintf(o.ErrOut, "backup %q verified: sha256 %s, revision %d, %d keys\n", o.Name, v.Backup.GetSha256(), v.Status.Revision, v.Status.TotalKey)
		},
		Rebuilding: func() {
			if deltas != nil {
				o.endStep("replay")
			}
		},
		MovedAside: func(to string) { fmt.Fprintf(o.ErrOut, "the old data directory was moved to %s\n", to) },
	}
	res, err := member.Restore(ctx, c, member.Options{Name: o.Name, Location: o.Location, FromFile: o.FromFile, Member: o.Member, WorkDir: work, Identities: ids, SHA256: sha, Deltas: deltas}, ev)
	bar.Finish(false)
	if err != nil {
		o.failedAfter()
	}
	if errors.Is(err, crypt.ErrIdentityRequired) {
		return fmt.Errorf("restore %q: the backup is age-encrypted and no identity was given: %s; nothing was changed", o.Name, passIdentity)
	}
	if errors.Is(err, crypt.ErrNoMatchingIdentity) {
		return fmt.Errorf("restore %q: none of the identities given can decrypt the backup (see its recipients with `kubectl etcdbackup get %s -o yaml`); nothing was changed", o.Name, o.Name)
	}
	var fe *fetch.Error
	if errors.As(err, &fe) && fe.Kind == fetch.Download {
		// The server's words; a segment's error names the segment.
		cause := fe.Err
		if fe.Segment {
			cause = fe
		}
		return conn.explain("download "+quote(o.Name), cause)
	}
	if err != nil {
		return err
	}
	if deltas != nil {
		fmt.Fprintf(o.Out, "replayed %d revisions of %d delta segments after backup %q: the keyspace is as it was at revision %d%s\n",
			res.ReplayedRevisions, len(deltas.Segments), o.Name, res.ToRevision, seenAt(res.PointTime))
		if !o.point.Time.IsZero() {
			// Each member is restored on its own: the same time could
			// plan differently later (a segment stored meanwhile), the
			// same revision cannot.
			fmt.Fprintf(o.Out, "restore the target's other members with --to-revision %d (not --to-time), so that every member holds this same keyspace\n", res.ToRevision)
		}
	}
	if o.rebuilding {
		fmt.Fprintf(o.Out, "restored %q into %s for etcd member %q of cluster %s\n", o.Name, o.Member.DataDir, o.Member.Name, o.Member.InitialCluster)
	} else {
		fmt.Fprintf(o.Out, "restored %q into %s for member %q; start etcd with --data-dir %s --name %s --initial-cluster %s --initial-advertise-peer-urls %s\n",
			o.Name, o.Member.DataDir, o.Member.Name, o.Member.DataDir, o.Member.Name, o.Member.InitialCluster, strings.Join(o.Member.InitialAdvertisePeerURLs, ","))
	}
	if res.BumpRevision > 0 {
		fmt.Fprintf(o.Out, "revision bumped by %d (from %d to %d) and marked compacted (watchers and informers will relist)\n",
			res.BumpRevision, res.SnapshotRevision, res.SnapshotRevision+res.BumpRevision)
	} else {
		fmt.Fprintln(o.Out, bumpSummary(0))
	}
	if len(res.RevokedServerKeys) > 0 {
		fmt.Fprintf(o.Out, "removed the data server's Job-signing key and agent CA (%s) at revision %d: every backup of this cluster holds them, so the server makes new ones within 30 s of the cluster's return, and refuses agent Jobs signed before; restore every member of this cluster with this version, so that each removes them at the same revision\n",
			strings.Join(res.RevokedServerKeys, ", "), res.Revision)
	}
	if !o.rebuilding {
		// A node's rebuild goes on (the static-pod manifests): it prints
		// its own once done.
		fmt.Fprintln(o.Out, o.restoredIn())
	}
	return nil
}

// clock reads o.now (time.Now when unset).
func (o *RestoreOptions) clock() time.Time {
	if o.now == nil {
		return time.Now()
	}
	return o.now()
}

// endStep says step name of the restore ended now.
func (o *RestoreOptions) endStep(name string) {
	o.steps = append(o.steps, restoreStep{name, o.clock()})
}

// lastEnd is where the next step begins.
func (o *RestoreOptions) lastEnd() time.Time {
	if len(o.steps) == 0 {
		return o.start
	}
	return o.steps[len(o.steps)-1].end
}

// restoredIn ends the restore's last step, "rebuild" (writing the data
// directory, and a node's rebuild the manifests too), and says how long
// it took from the start of Run, each step's part after the colon:
// "restored in 1m23s: download 41s, verify 6s, rebuild 36s".
func (o *RestoreOptions) restoredIn() string {
	o.endStep("rebuild")
	parts := make([]string, 0, len(o.steps))
	from := o.start
	for _, s := range o.steps {
		parts = append(parts, s.name+" "+roundElapsed(s.end.Sub(from)))
		from = s.end
	}
	return "restored in " + roundElapsed(from.Sub(o.start)) + ": " + strings.Join(parts, ", ")
}

// failedAfter says on stderr how long a restore ran before it failed:
// the error says why, this what the attempt cost of the recovery time.
func (o *RestoreOptions) failedAfter() {
	fmt.Fprintf(o.ErrOut, "restore failed after %s\n", roundElapsed(o.clock().Sub(o.start)))
}

// roundElapsed rounds d as a person reads it: to 0.1 s below 10 s (a
// step of a small restore), to the second above ("1m23s").
func roundElapsed(d time.Duration) string {
	if d < 10*time.Second {
		return strconv.FormatFloat(d.Round(100*time.Millisecond).Seconds(), 'f', -1, 64) + "s"
	}
	return d.Round(time.Second).String()
}

// bumpSummary says what a restore with revision bump b does to etcd's
// revisions, and for 0 what that risks.
func bumpSummary(b int64) string {
	if b > 0 {
		return fmt.Sprintf("revision bumped by %d and marked compacted (watchers and informers will relist)", b)
	}
	return "revisions kept as in the snapshot (--bump-revision 0), nothing marked compacted: Kubernetes clients of this etcd (the API server's watch cache, informers, kubelets) may keep stale caches and miss changes; restart them"
}

// runTarget asks the server to restore every member of o.Target.
func (o *RestoreOptions) runTarget(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Everything below names the location that holds the backup; to a
	// point without a NAME, --location or the server's default is where
	// the server plans.
	if o.Name != "" {
		if o.Location, err = o.resolveLocation(ctx, conn, "restore "+quote(o.Name), o.Name); err != nil {
			return err
		}
	}
	// Always set, default included: the flag's value is what the server
	// applies, whatever its own default.
	bump := o.BumpRevision
	req := &ebv1.RestoreBackupRequest{
		Name: o.Name, Location: o.Location, Target: o.Target, DryRun: o.DryRun, MoveAside: o.Member.MoveAside,
		IdentitySecret: o.IdentitySecret, BumpRevision: &bump,
		ToRevision: o.point.Revision, AllowLeaseLoss: o.AllowLeaseLoss,
	}
	what := "restore " + quote(o.Name)
	if o.toPoint() {
		what = "restore to " + o.point.String()
		if !o.point.Time.IsZero() {
			req.ToTime = timestamppb.New(o.point.Time)
		}
	}
	resp, err := conn.Backups.RestoreBackup(ctx, req)
	if err != nil {
		return conn.explain(what+" into target "+quote(o.Target), err)
	}
	if o.toPoint() {
		// The full backup the server picked: what --wait follows.
		o.Name, o.segments, o.plannedRevision = resp.GetBackup(), resp.GetSegments(), resp.GetToRevision()
		for _, w := range resp.GetWarnings() {
			fmt.Fprintf(o.ErrOut, "warning: %s\n", w)
		}
	}
	members := resp.GetMembers()
	if !o.PrintFlags.Human() && (o.DryRun || !o.Wait) {
		return o.PrintFlags.Print(o.Out, o.restoreObject(members), nil)
	}
	if o.DryRun {
		if o.toPoint() {
			fmt.Fprintf(o.Out, "would restore target %q to %s: full backup %q, then %d delta segments replayed up to %s (nothing was changed):\n",
				o.Target, o.point, o.Name, len(o.segments), o.plannedPoint())
		} else {
			fmt.Fprintf(o.Out, "would restore backup %q into the %d members of target %q (nothing was changed):\n", o.Name, len(members), o.Target)
		}
		for _, m := range members {
			fmt.Fprintf(o.Out, "  member %s: job %s writes %s (data dir %q), peer URL %s, initial cluster %s, token %q\n",
				m.GetMember(), m.GetJobName(), m.GetVolume(), dataDirLabel(m.GetDataDir()), m.GetPeerUrl(), m.GetInitialCluster(), tokenLabel(m.GetInitialClusterToken()))
			fmt.Fprintf(o.Out, "    after restoring: %s\n", bumpSummary(m.GetBumpRevision()))
			if m.GetMessage() != "" {
				fmt.Fprintf(o.Out, "    %s\n", m.GetMessage())
			}
		}
		return nil
	}
	if o.toPoint() {
		fmt.Fprintf(o.ErrOut, "restoring target %q to %s: full backup %q, then %d delta segments replayed up to %s\n",
			o.Target, o.point, o.Name, len(o.segments), o.plannedPoint())
	}
	for _, m := range members {
		fmt.Fprintf(o.ErrOut, "restoring member %s into %s with job %s\n", m.GetMember(), m.GetVolume(), m.GetJobName())
	}
	if !o.Wait && o.toPoint() {
		// Not `restore NAME --wait`: that would restore the full backup
		// as it is once this ends.
		fmt.Fprintf(o.Out, "restore of target %q to %s started (full backup %q, %d delta segments); follow its Jobs with `kubectl get jobs -A -l app.kubernetes.io/component=restore-agent`, or pass --wait next time\n",
			o.Target, o.plannedPoint(), o.Name, len(o.segments))
		return nil
	}
	if !o.Wait {
		fmt.Fprintf(o.Out, "restore of %q into target %q started; follow it with `kubectl etcdbackup restore %s --target %s --wait`\n", o.Name, o.Target, o.Name, o.Target)
		return nil
	}
	return o.waitTarget(ctx, conn)
}

// waitTarget polls the restore every PollInterval until every member
// succeeded, one failed, or WaitTimeout passes, printing each member's
// phase changes with the time since the wait began on stderr. A poll that
// fails transiently (the server pod replaced) is retried for
// --retry-timeout.
func (o *RestoreOptions) waitTarget(ctx context.Context, conn *Connection) error {
	start := time.Now()
	var members []*ebv1.MemberRestore
	seen := map[string]ebv1.RestorePhase{}
	err := pollServer(ctx, conn, "wait for the restore of "+quote(o.Name), o.PollInterval, o.WaitTimeout, true,
		func(ctx context.Context) (*ebv1.GetRestoreResponse, error) {
			return conn.Backups.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: o.Name, Location: o.Location, Target: o.Target})
		},
		func(resp *ebv1.GetRestoreResponse) (bool, error) {
			members = resp.GetMembers()
			done := true
			for _, m := range members {
				if p, ok := seen[m.GetMember()]; !ok || p != m.GetPhase() {
					seen[m.GetMember()] = m.GetPhase()
					fmt.Fprintf(o.ErrOut, "member %s: %s after %s\n", m.GetMember(), restorePhaseString(m.GetPhase()), time.Since(start).Round(time.Second))
				}
			}
			for _, m := range members {
				switch m.GetPhase() {
				case ebv1.RestorePhase_RESTORE_PHASE_FAILED:
					ns, job, _ := strings.Cut(m.GetJobName(), "/")
					// The agent's last words (its termination message, or
					// the end of its log).
					printLogTail(o.ErrOut, strings.TrimSpace(m.GetMessage()))
					o.failedAfter()
					return false, withCode(ExitFailed, fmt.Errorf("restore of member %s failed: %s; see `kubectl -n %s logs job/%s`", m.GetMember(), m.GetMessage(), ns, job))
				case ebv1.RestorePhase_RESTORE_PHASE_SUCCEEDED:
				default:
					done = false
				}
			}
			return done, nil
		})
	if wait.Interrupted(err) {
		return stillRunning(ctx, start, fmt.Sprintf("the restore of %q into target %q", o.Name, o.Target), "see `kubectl get jobs -A -l app.kubernetes.io/component=restore-agent`")
	}
	if err != nil {
		return err
	}
	// From the command, not the wait: the server's checks and the Jobs'
	// start are part of the recovery time. GetRestore carries no times of
	// the members' Jobs, so there is no part per member.
	took := fmt.Sprintf("target %q restored in %s, from the command to every member's Job succeeded", o.Target, roundElapsed(o.clock().Sub(o.start)))
	if !o.PrintFlags.Human() {
		if err := o.PrintFlags.Print(o.Out, o.restoreObject(members), nil); err != nil {
			return err
		}
		// Stdout holds the document alone.
		fmt.Fprintln(o.ErrOut, took)
		return nil
	}
	for _, m := range members {
		fmt.Fprintf(o.Out, "member %s restored into %s (data dir %q); %s\n", m.GetMember(), m.GetVolume(), dataDirLabel(m.GetDataDir()), bumpSummary(m.GetBumpRevision()))
	}
	if o.toPoint() {
		fmt.Fprintf(o.Out, "target %q restored to %s (full backup %q, %d delta segments replayed): start the members again\n", o.Target, o.plannedPoint(), o.Name, len(o.segments))
	} else {
		fmt.Fprintf(o.Out, "restore of %q into target %q done: start the members again\n", o.Name, o.Target)
	}
	fmt.Fprintln(o.Out, took)
	return nil
}

// restoreObject is the Restore -o prints.
func (o *RestoreOptions) restoreObject(members []*ebv1.MemberRestore) *Restore {
	spec := RestoreSpec{Backup: o.Name, Location: o.Location, Target: o.Target, DryRun: o.DryRun, MoveAside: o.Member.MoveAside, BumpRevision: o.BumpRevision}
	if o.toPoint() {
		spec.ToRevision, spec.Segments = o.plannedRevision, o.segments
		if !o.point.Time.IsZero() {
			spec.ToTime = o.point.Time.UTC().Format(time.RFC3339Nano)
		}
	}
	return restoreObject(spec, members)
}

// plannedPoint says where an in-cluster restore to a point stops.
func (o *RestoreOptions) plannedPoint() string {
	if o.plannedRevision > 0 {
		return fmt.Sprintf("revision %d", o.plannedRevision)
	}
	return "the last revision seen at or before " + o.point.String()
}

func dataDirLabel(d string) string {
	if d == "" {
		return "."
	}
	return d
}

func tokenLabel(t string) string {
	if t == "" {
		return "etcd-cluster"
	}
	return t
}
