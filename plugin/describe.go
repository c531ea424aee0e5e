package plugin

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// DescribeOptions are the options of `kubectl etcdbackup describe`.
type DescribeOptions struct {
	*GlobalOptions
	Name string
}

// NewCmdDescribe returns the describe command.
func NewCmdDescribe(g *GlobalOptions) *cobra.Command {
	o := &DescribeOptions{GlobalOptions: g}
	cmd := &cobra.Command{
		Use:   "describe NAME",
		Short: "Show everything known of one backup, kubectl describe style",
		Long: `describe prints a backup's details for a person: where it is, its phase, the
etcd it came from (cluster and member IDs, revision, version), stored and raw
size, compression, checksums, how it arrived (upload, or the agent Job that
took it), when and how long it took, and its labels. For scripts use
"get NAME -o json".

A copy (a backup the server copied from another location) says so in Copy
Of. A backup of a location with copies lists them in Copies: each copy
location, the copy's state (Copied, Pending, Retrying, Conflict, Skipped,
Unknown), when it was copied and whether its SHA-256 is the backup's, or
why it is not there yet and when the server tries again. Given a name held
by a backup and its copies, describe shows the original; if the original
is gone, or its location cannot be read, the first copy, with a note on
stderr.`,
		Example: examples(`
# Show the details of a backup
kubectl etcdbackup describe control-plane-20260131-020000

# Show the details of a backup kept in location s3
kubectl etcdbackup describe control-plane-20260131-020000 --location s3

# Show the copy of a backup kept in copy location offsite
kubectl etcdbackup describe control-plane-20260131-020000 --location offsite`),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeBackupNames(g, 1),
		RunE:              runE(o),
	}
	addStorageConfigFlag(cmd, g)
	return cmd
}

// Complete takes the backup's name from the arguments.
func (o *DescribeOptions) Complete(_ *cobra.Command, args []string) error {
	o.Name = backupName(args[0])
	return nil
}

// Validate has nothing to check: the server owns the naming rules.
func (o *DescribeOptions) Validate() error { return nil }

// Run describes the backup.
func (o *DescribeOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	b, err := o.findBackup(ctx, conn, "describe backup "+quote(o.Name), o.Name)
	if err != nil {
		return err
	}
	now := time.Now()
	w := printers.GetNewTabWriter(o.Out)
	describeBackup(w, b, now)
	if b.GetSource().GetKind() != ebv1.SourceUpload { // an upload has no agent Job
		describeEvents(ctx, w, conn, b, now)
	}
	return w.Flush()
}

// describeEvents writes the events of the backup's agent Job and pods as
// kubectl describe does. Events are a help, not the answer: a server
// that cannot give them says why in the section, and describe succeeds.
func describeEvents(ctx context.Context, w io.Writer, conn *Connection, b *ebv1.Backup, now time.Time) {
	resp, err := conn.Backups.GetBackupEvents(ctx, &ebv1.GetBackupEventsRequest{Name: b.GetName(), Location: b.GetLocation()})
	switch status.Code(err) {
	case codes.OK:
	case codes.Unimplemented:
		return // an older server
	case codes.NotFound, codes.FailedPrecondition:
		fmt.Fprintln(w, "Events:\t<none>")
		return
	default:
		fmt.Fprintf(w, "Events:\t<unavailable: %s>\n", status.Convert(err).Message())
		return
	}
	fmt.Fprintf(w, "Agent Job:\t%s\n", resp.GetJobName())
	if len(resp.GetEvents()) == 0 {
		fmt.Fprintln(w, "Events:\t<none>")
		return
	}
	fmt.Fprintln(w, "Events:")
	fmt.Fprintln(w, "  Type\tReason\tAge\tObject\tMessage")
	fmt.Fprintln(w, "  ----\t------\t----\t------\t-------")
	for _, e := range resp.GetEvents() {
		age := "<unknown>"
		if t := e.GetLastTime(); knownTime(t) {
			age = duration.HumanDuration(now.Sub(t.AsTime()))
			if n := e.GetCount(); n > 1 {
				age = fmt.Sprintf("%s (x%d)", age, n)
			}
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", e.GetType(), e.GetReason(), age, e.GetObject(), strings.TrimSpace(e.GetMessage()))
	}
}

// describeBackup writes Key:\tvalue lines for a tabwriter, as kubectl
// describe and velero describe do: the backup, then its Source, etcd and
// Data sections.
func describeBackup(w io.Writer, b *ebv1.Backup, now time.Time) {
	field(w, "Name", b.GetName())
	field(w, "Location", b.GetLocation())
	if c := b.GetCopyOf(); c != nil {
		field(w, "Copy Of", copyOfString(c, now))
	}
	field(w, "Phase", phaseString(b.GetPhase()))
	if m := b.GetMessage(); m != "" {
		field(w, "Message", m)
	}
	field(w, "Labels", labelsString(b.GetLabels()))
	if t := b.GetLockedUntil(); t != nil {
		if t.AsTime().After(now) {
			field(w, "Locked Until", t.AsTime().UTC().Format(time.RFC3339)+" (object lock: the store refuses to delete it before then)")
		} else {
			field(w, "Locked Until", t.AsTime().UTC().Format(time.RFC3339)+" (ended)")
		}
	}
	if t := b.GetCreateTime(); knownTime(t) {
		field(w, "Created", fmt.Sprintf("%s (%s ago)", t.AsTime().UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(t.AsTime()))))
	} else {
		field(w, "Created", "<unknown>")
	}
	describeSource(w, b)
	if e := b.GetEtcd(); e != nil {
		describeEtcd(w, b, e)
	}
	describeData(w, b)
	describeVerification(w, b, now)
	describeChain(w, b, now)
	describeKit(w, b)
	describeCopies(w, b, now)
	if b.GetPhase() == ebv1.BackupPhase_BACKUP_PHASE_FAILED {
		fmt.Fprintf(w, "Next:\tkubectl etcdbackup logs %s --location %s\n", b.GetName(), b.GetLocation())
	}
}

// field writes a Key:\tvalue line; subfield one of a section.
func field(w io.Writer, k string, v any)    { fmt.Fprintf(w, "%s:\t%v\n", k, v) }
func subfield(w io.Writer, k string, v any) { fmt.Fprintf(w, "  %s:\t%v\n", k, v) }

// describeSource writes how the backup arrived: its Source section.
func describeSource(w io.Writer, b *ebv1.Backup) {
	s := b.GetSource()
	fmt.Fprintln(w, "Source:")
	subfield(w, "Kind", orNone(s.GetKind()))
	if s.GetTarget() != "" {
		subfield(w, "Target", s.GetTarget())
	}
	if s.GetClaimedTarget() != "" {
		subfield(w, "Claimed Target", s.GetClaimedTarget()+" (the uploader's word: never restored to a point, drilled or retained as that target's backup)")
	}
	if s.GetDescription() != "" {
		subfield(w, "Description", s.GetDescription())
	}
	if s.GetKind() != ebv1.SourceUpload {
		// Logs reach the agent through the server, without the user's
		// pods/log permission.
		subfield(w, "Agent Logs", "kubectl etcdbackup logs "+b.GetName()+" --location "+b.GetLocation())
	}
	if knownTime(s.GetStartTime()) {
		subfield(w, "Started", s.GetStartTime().AsTime().UTC().Format(time.RFC3339))
	}
	if knownTime(s.GetEndTime()) {
		subfield(w, "Finished", s.GetEndTime().AsTime().UTC().Format(time.RFC3339))
	}
	if knownTime(s.GetStartTime()) && knownTime(s.GetEndTime()) {
		subfield(w, "Duration", s.GetEndTime().AsTime().Sub(s.GetStartTime().AsTime()).Round(time.Millisecond))
	}
}

// describeEtcd writes what the backup records of etcd e: its etcd
// section.
func describeEtcd(w io.Writer, b *ebv1.Backup, e *ebv1.EtcdInfo) {
	fmt.Fprintln(w, "etcd:")
	subfield(w, "Cluster ID", orNone(hexID(e.GetClusterId())))
	subfield(w, "Member ID", orNone(hexID(e.GetMemberId())))
	subfield(w, "Member Name", orNone(e.GetMemberName()))
	subfield(w, "Revision", revisionString(b))
	if e.GetSnapshotStatus() {
		subfield(w, "Keys", keysString(b))
		subfield(w, "Hash", hashString(b))
	} else if e.GetRevision() != 0 {
		subfield(w, "Keys", "<none> (recorded before backups read their snapshot's status; `kubectl etcdbackup verify` reads it)")
	}
	if e.GetKeyspace() {
		ks := fmt.Sprintf("%d keys at revision %d, HashKV %d", e.GetKeyspaceKeys(), e.GetRevision(), e.GetHashKv())
		if e.GetCompactRevision() > 0 {
			ks += fmt.Sprintf(", compacted at %d", e.GetCompactRevision())
		}
		subfield(w, "Keyspace", ks)
	}
	subfield(w, "Version", orNone(e.GetVersion()))
	if e.GetDbSize() > 0 {
		subfield(w, "Database Size", sizeString(e.GetDbSize()))
	}
}

// describeData writes how the backup is stored: its Data section.
func describeData(w io.Writer, b *ebv1.Backup) {
	fmt.Fprintln(w, "Data:")
	subfield(w, "Stored Size", sizeString(b.GetSize()))
	if b.GetRawSize() > 0 {
		subfield(w, "Raw Size", sizeString(b.GetRawSize()))
	}
	subfield(w, "Compression", orNone(b.GetCompression()))
	if b.GetEncryption() != "" {
		subfield(w, "Encryption", b.GetEncryption())
		lines(w, "Recipients", b.GetAgeRecipients())
	} else {
		subfield(w, "Encryption", "<none>")
	}
	subfield(w, "SHA256", orNone(b.GetSha256()))
	if b.GetRawSha256() != "" {
		subfield(w, "Raw SHA256", b.GetRawSha256())
	}
}

// describeVerification writes the newest restore drill's verdict: its
// Verification section.
func describeVerification(w io.Writer, b *ebv1.Backup, now time.Time) {
	v := b.GetVerification()
	if v == nil {
		if b.GetPhase() == ebv1.BackupPhase_BACKUP_PHASE_COMPLETED {
			field(w, "Verification", "<none> (no restore drill ran; `kubectl etcdbackup drill "+b.GetName()+"` runs one)")
		}
		return
	}
	fmt.Fprintln(w, "Verification:")
	subfield(w, "Result", verificationResultString(v.GetResult()))
	if knownTime(v.GetTime()) {
		subfield(w, "Time", fmt.Sprintf("%s (%s ago)", v.GetTime().AsTime().UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(v.GetTime().AsTime()))))
	}
	if v.GetRevision() != 0 {
		subfield(w, "Restored", fmt.Sprintf("revision %d, %d keys, HashKV %d", v.GetRevision(), v.GetKeys(), v.GetHashKv()))
	}
	if d := v.GetDurationSeconds(); d > 0 {
		subfield(w, "Duration", (time.Duration(d * float64(time.Second))).Round(time.Millisecond))
	}
	subfield(w, "Message", orNone(v.GetMessage()))
	if v.GetJob() != "" {
		subfield(w, "Job", v.GetJob())
	}
}

// describeChain writes a full backup's delta chain, as stored: how far a
// restore to a point from it reaches.
func describeChain(w io.Writer, b *ebv1.Backup, now time.Time) {
	c := b.GetChain()
	if c == nil {
		return
	}
	fmt.Fprintln(w, "Delta Chain:")
	subfield(w, "Revisions", fmt.Sprintf("%d to %d", b.GetEtcd().GetRevision()+1, c.GetLastRevision()))
	if knownTime(c.GetLastTime()) {
		subfield(w, "Newest Event", fmt.Sprintf("%s (%s ago)", c.GetLastTime().AsTime().UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(c.GetLastTime().AsTime()))))
	}
	subfield(w, "Segments", fmt.Sprintf("%d, %s", c.GetSegments(), sizeString(c.GetBytes())))
	subfield(w, "Writer Epoch", c.GetEpoch())
	if r := c.GetEndReason(); r != "" {
		subfield(w, "Ended", r+" (a new full backup starts a new chain)")
	} else {
		subfield(w, "Ended", "<no> (still growing)")
	}
}

// describeKit writes the backup's recovery kit: what it holds, the
// versions a rebuild checks, and who can open it.
func describeKit(w io.Writer, b *ebv1.Backup) {
	k := b.GetKit()
	if k == nil {
		return
	}
	fmt.Fprintln(w, "Recovery Kit:")
	subfield(w, "Stored As", k.GetName())
	subfield(w, "Size", sizeString(k.GetSize()))
	subfield(w, "SHA256", k.GetSha256())
	subfield(w, "Node", orNone(k.GetNode()))
	subfield(w, "Paths", strings.Join(k.GetPaths(), ", "))
	subfield(w, "Versions", fmt.Sprintf("etcd %s, Kubernetes %s", orNone(k.GetVersions().GetEtcd()), orNone(k.GetVersions().GetKubernetes())))
	lines(w, "Encrypted To", k.GetAgeRecipients())
	subfield(w, "Entries", k.GetEntries())
	for _, f := range k.GetFiles() {
		line := fmt.Sprintf("%s %8d %s", fs.FileMode(f.GetMode()), f.GetSize(), f.GetPath())
		if l := f.GetLink(); l != "" {
			line += " -> " + l
		}
		fmt.Fprintf(w, "    %s\n", line)
	}
	fmt.Fprintf(w, "  Next:\tkubectl etcdbackup verify %s --identity KEYFILE (opens it here and checks every file); restore --local --rebuild brings a lost node back from it\n", b.GetName())
}

// copyOfString is a copy's Copy Of line: the location it was copied
// from and when.
func copyOfString(c *ebv1.BackupCopyOf, now time.Time) string {
	if t := c.GetCopyTime(); knownTime(t) {
		return fmt.Sprintf("%s (copied %s, %s ago)", c.GetLocation(), t.AsTime().UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(t.AsTime())))
	}
	return c.GetLocation()
}

// describeCopies writes the backup's copies, one subsection per copy
// location: its state, when it was copied and whether its SHA-256 is
// the backup's, or why it is not there yet and when the server tries
// again.
func describeCopies(w io.Writer, b *ebv1.Backup, now time.Time) {
	if len(b.GetCopies()) == 0 {
		return
	}
	fmt.Fprintln(w, "Copies:")
	for _, c := range b.GetCopies() {
		fmt.Fprintf(w, "  %s:\n", c.GetLocation())
		state := copyStateString(c.GetState())
		switch c.GetState() {
		case ebv1.BackupCopyState_BACKUP_COPY_STATE_RETRYING:
			if t := c.GetFailingSince(); knownTime(t) {
				state += fmt.Sprintf(" (failing since %s, %s)", t.AsTime().UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(t.AsTime())))
			}
		case ebv1.BackupCopyState_BACKUP_COPY_STATE_CONFLICT:
			state += " (the location holds another backup of this name: nothing is copied over it)"
		case ebv1.BackupCopyState_BACKUP_COPY_STATE_SKIPPED:
			state += " (the copy was deleted there: it is not copied again)"
		case ebv1.BackupCopyState_BACKUP_COPY_STATE_UNKNOWN:
			state += " (the location cannot be read now)"
		}
		fmt.Fprintf(w, "    State:\t%s\n", state)
		if t := c.GetCopyTime(); knownTime(t) {
			fmt.Fprintf(w, "    Copied:\t%s (%s ago)\n", t.AsTime().UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(t.AsTime())))
		}
		if sum := c.GetSha256(); sum != "" {
			if sum == b.GetSha256() {
				sum += " (the backup's)"
			} else {
				sum += " (NOT the backup's " + orNone(b.GetSha256()) + ")"
			}
			fmt.Fprintf(w, "    SHA256:\t%s\n", sum)
		}
		if m := c.GetMessage(); m != "" {
			fmt.Fprintf(w, "    Message:\t%s\n", m)
		}
		if t := c.GetNextAttempt(); knownTime(t) {
			when := "due now"
			if d := t.AsTime().Sub(now); d > 0 {
				when = "in " + duration.HumanDuration(d)
			}
			fmt.Fprintf(w, "    Next Attempt:\t%s (%s)\n", t.AsTime().UTC().Format(time.RFC3339), when)
		}
	}
}

func sizeString(n int64) string {
	return fmt.Sprintf("%s (%d bytes)", humanize.IBytes(uint64(n)), n)
}

// knownTime reports whether t is set to a real time: not absent, and not
// the zero time a Job without a creation time converts to.
func knownTime(t *timestamppb.Timestamp) bool {
	return t != nil && t.AsTime().Unix() > 0
}

// lines writes a section's field of several values, one per line.
func lines(w io.Writer, key string, values []string) {
	for i, v := range values {
		k := ""
		if i == 0 {
			k = key
		}
		fmt.Fprintf(w, "  %s\t%s\n", pad(k), v)
	}
}

// pad writes a key of a multi-line value: "Key:" on the first line,
// nothing on the next ones.
func pad(k string) string {
	if k == "" {
		return ""
	}
	return k + ":"
}
