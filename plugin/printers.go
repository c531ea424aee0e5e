package plugin

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

var backupColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string"},
	{Name: "Location", Type: "string"},
	{Name: "Phase", Type: "string"},
	{Name: "Size", Type: "string"},
	{Name: "Age", Type: "string"},
	{Name: "Verified", Type: "string"},
	{Name: "Source", Type: "string", Priority: 1},
	{Name: "Revision", Type: "string", Priority: 1},
	{Name: "Keys", Type: "string", Priority: 1},
	{Name: "Hash", Type: "string", Priority: 1},
	{Name: "Compression", Type: "string", Priority: 1},
	{Name: "Kit", Type: "string", Priority: 1},
	{Name: "Locked-Until", Type: "string", Priority: 1},
	{Name: "SHA256", Type: "string", Priority: 1},
	{Name: "Labels", Type: "string", Priority: 1},
}

// printBackups writes backups in the format -o asks for: the table
// (cli-runtime's own table printer, wide columns at priority 1), or one
// Backup (single) or a BackupList as a Kubernetes-style object.
func printBackups(out io.Writer, pf *PrintFlags, bs []*ebv1.Backup, single bool) error {
	var obj runtime.Object = backupList(bs)
	if single && len(bs) == 1 {
		b := backupObject(bs[0])
		obj = &b
	}
	return pf.Print(out, obj, func(w io.Writer) error {
		return printBackupTable(w, bs, pf.Wide(), pf.NoHeaders, time.Now())
	})
}

func printBackupTable(out io.Writer, bs []*ebv1.Backup, wide, noHeaders bool, now time.Time) error {
	table := &metav1.Table{ColumnDefinitions: backupColumns}
	for _, b := range bs {
		table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{
			b.GetName(),
			b.GetLocation(),
			phaseString(b.GetPhase()),
			humanize.IBytes(uint64(b.GetSize())),
			age(b, now),
			verifiedString(b.GetVerification(), now),
			sourceString(b.GetSource()),
			revisionString(b),
			keysString(b),
			hashString(b),
			orNone(b.GetCompression()),
			kitString(b.GetKit()),
			lockedUntilString(b, now),
			b.GetSha256(),
			labelsString(b.GetLabels()),
		}})
	}
	return printers.NewTablePrinter(printers.PrintOptions{Wide: wide, NoHeaders: noHeaders}).PrintObj(table, out)
}

// kitString is the KIT column: the recovery kit's entries and size, or
// <none>.
func kitString(k *ebv1.Kit) string {
	if k == nil {
		return "<none>"
	}
	return fmt.Sprintf("%d entries, %s", k.GetEntries(), humanize.IBytes(uint64(k.GetSize())))
}

func age(b *ebv1.Backup, now time.Time) string {
	if b.GetCreateTime() == nil {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(b.GetCreateTime().AsTime()))
}

// verifiedString is how long ago a restore drill last proved the backup
// restores, or Failed (it did not) or Error (the drill reached no
// verdict), or <none>.
func verifiedString(v *ebv1.Verification, now time.Time) string {
	switch v.GetResult() {
	case ebv1.VerificationResult_VERIFICATION_RESULT_SUCCEEDED:
		return duration.HumanDuration(now.Sub(v.GetTime().AsTime()))
	case ebv1.VerificationResult_VERIFICATION_RESULT_FAILED, ebv1.VerificationResult_VERIFICATION_RESULT_ERROR:
		return verificationResultString(v.GetResult())
	}
	return "<none>"
}

func verificationResultString(r ebv1.VerificationResult) string {
	return enumWord(r, "VERIFICATION_RESULT_")
}

func phaseString(p ebv1.BackupPhase) string { return enumWord(p, "BACKUP_PHASE_") }

// enumWord is a protobuf enum value as the plugin prints it: its name
// without the enum's prefix, each word capitalised ("BACKUP_PHASE_RUNNING"
// is "Running"), and "Unknown" for UNSPECIFIED or a number this build does
// not name.
func enumWord(v fmt.Stringer, prefix string) string {
	rest, ok := strings.CutPrefix(v.String(), prefix)
	if !ok || rest == "UNSPECIFIED" {
		return "Unknown"
	}
	var b strings.Builder
	for _, w := range strings.Split(rest, "_") {
		if w != "" {
			b.WriteString(w[:1] + strings.ToLower(w[1:]))
		}
	}
	return b.String()
}

func sourceString(s *ebv1.BackupSource) string {
	switch {
	case s.GetTarget() != "":
		return s.GetKind() + ":" + s.GetTarget()
	case s.GetKind() != "":
		return s.GetKind()
	}
	return "<none>"
}

func revisionString(b *ebv1.Backup) string {
	if b.GetEtcd().GetRevision() == 0 {
		return "<none>"
	}
	return fmt.Sprint(b.GetEtcd().GetRevision())
}

// keysString and hashString show what was read from the snapshot itself;
// an older backup, which recorded only the member's revision, has none.
func keysString(b *ebv1.Backup) string {
	if !b.GetEtcd().GetSnapshotStatus() {
		return "<none>"
	}
	return fmt.Sprint(b.GetEtcd().GetTotalKeys())
}

func hashString(b *ebv1.Backup) string {
	if !b.GetEtcd().GetSnapshotStatus() {
		return "<none>"
	}
	return fmt.Sprintf("%08x", b.GetEtcd().GetHash())
}

func labelsString(l map[string]string) string {
	if len(l) == 0 {
		return "<none>"
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// lockedUntilString is the LOCKED-UNTIL column: when the store's object
// lock retention of the backup ends, or <none> (not locked, or no more).
func lockedUntilString(b *ebv1.Backup, now time.Time) string {
	t := b.GetLockedUntil()
	if t == nil || !t.AsTime().After(now) {
		return "<none>"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}
