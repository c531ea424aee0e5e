package plugin

import (
	"fmt"
	"io"
	"slices"
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

// copiesColumn is the COPIES column, after VERIFIED: shown only when a
// backup printed has copies or is one (copiesShown), or a copy was
// folded into a row (foldCopies).
var (
	copiesColumn   = metav1.TableColumnDefinition{Name: "Copies", Type: "string"}
	copiesColumnAt = slices.IndexFunc(backupColumns, func(c metav1.TableColumnDefinition) bool { return c.Name == "Verified" }) + 1
)

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
		return printBackupTable(w, bs, nil, pf.Wide(), pf.NoHeaders, time.Now())
	})
}

// printBackupList is list's printBackups: with fold (several locations
// listed), a copy listed beside its original is one row, the
// original's, whose COPIES counts it, and -o name prints the name once.
// The documents (json, yaml, jsonpath, go-template, custom-columns) keep
// every backup listed, copies too, each saying what it is a copy of
// (status.copyOf): a script filters them itself (docs/scripting.md).
func printBackupList(out io.Writer, pf *PrintFlags, bs []*ebv1.Backup, fold bool) error {
	rows, folded := bs, map[*ebv1.Backup][]*ebv1.Backup(nil)
	if fold {
		rows, folded = foldCopies(bs)
	}
	// The table is printed from the backups themselves: the documents
	// (a Kubernetes-style object per backup) are built only for -o.
	var obj runtime.Object
	switch {
	case pf.Human():
	case pf.OutputFormat == "name":
		obj = backupList(rows)
	default:
		obj = backupList(bs)
	}
	return pf.Print(out, obj, func(w io.Writer) error {
		return printBackupTable(w, rows, folded, pf.Wide(), pf.NoHeaders, time.Now())
	})
}

// foldCopies returns the backups to print as rows: bs without each copy
// whose original is listed too (the backup of the same name and SHA-256
// in the location its copyOf names, followed to the first original of a
// copy of a copy), and for each original the copies folded into it.
func foldCopies(bs []*ebv1.Backup) ([]*ebv1.Backup, map[*ebv1.Backup][]*ebv1.Backup) {
	type key struct{ location, name string }
	at := map[key]*ebv1.Backup{}
	for _, b := range bs {
		at[key{b.GetLocation(), b.GetName()}] = b
	}
	// original follows b's copyOf to the backup it is a copy of, while
	// that is listed with the same bytes; nil if b is not a copy of a
	// listed backup. o may itself be a copy (of a copy, the original
	// not listed): b is then folded into that row. Copies form no cycle
	// (the server refuses such a configuration); one in a bad answer
	// folds nothing.
	original := func(b *ebv1.Backup) *ebv1.Backup {
		var o *ebv1.Backup
		seen := map[*ebv1.Backup]bool{b: true}
		for cur := b; cur.GetCopyOf() != nil; {
			next := at[key{cur.GetCopyOf().GetLocation(), cur.GetName()}]
			if next == nil || b.GetSha256() == "" || next.GetSha256() != b.GetSha256() {
				break
			}
			if seen[next] {
				return nil
			}
			seen[next] = true
			o, cur = next, next
		}
		return o
	}
	var rows []*ebv1.Backup
	folded := map[*ebv1.Backup][]*ebv1.Backup{}
	for _, b := range bs {
		if o := original(b); o != nil {
			folded[o] = append(folded[o], b)
			continue
		}
		rows = append(rows, b)
	}
	return rows, folded
}

func printBackupTable(out io.Writer, bs []*ebv1.Backup, folded map[*ebv1.Backup][]*ebv1.Backup, wide, noHeaders bool, now time.Time) error {
	withCopies := copiesShown(bs) || len(folded) > 0
	columns := backupColumns
	if withCopies {
		columns = slices.Insert(slices.Clone(backupColumns), copiesColumnAt, copiesColumn)
	}
	table := &metav1.Table{ColumnDefinitions: columns}
	for _, b := range bs {
		cells := []any{
			b.GetName(),
			b.GetLocation(),
			phaseString(b.GetPhase()),
			humanize.IBytes(uint64(b.GetSize())),
			age(b, now),
			verifiedString(b.GetVerification(), now),
		}
		if withCopies {
			cells = append(cells, copiesString(b, folded[b], now))
		}
		table.Rows = append(table.Rows, metav1.TableRow{Cells: append(cells,
			sourceString(b.GetSource()),
			revisionString(b),
			keysString(b),
			hashString(b),
			orNone(b.GetCompression()),
			kitString(b.GetKit()),
			lockedUntilString(b, now),
			b.GetSha256(),
			labelsString(b.GetLabels()),
		)})
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

// copiesShown says whether the table has a COPIES column: some backup
// has copies, or is one.
func copiesShown(bs []*ebv1.Backup) bool {
	return slices.ContainsFunc(bs, func(b *ebv1.Backup) bool { return len(b.GetCopies()) > 0 || b.GetCopyOf() != nil })
}

// copiesString is the COPIES column: "copy of LOCATION" for a copy;
// for an original, how many of its places hold it, N/M (itself and
// each copy location), then each copy not made yet and why: "1/2
// offsite: retrying 3m" (failing for 3m). folded are the copies listed
// beside it and printed in its row (foldCopies): one in a location
// the server's copies do not name (no longer a copy location) counts as
// copied. <none>: neither.
func copiesString(b *ebv1.Backup, folded []*ebv1.Backup, now time.Time) string {
	if c := b.GetCopyOf(); c != nil {
		return "copy of " + c.GetLocation()
	}
	held, all := 1, 1
	var missing []string
	named := map[string]bool{}
	for _, c := range b.GetCopies() {
		named[c.GetLocation()] = true
		all++
		if c.GetState() == ebv1.BackupCopyState_BACKUP_COPY_STATE_COPIED {
			held++
			continue
		}
		missing = append(missing, c.GetLocation()+": "+copyStateShort(c, now))
	}
	for _, f := range folded {
		if !named[f.GetLocation()] {
			named[f.GetLocation()] = true
			held++
			all++
		}
	}
	if all == 1 {
		return "<none>"
	}
	s := fmt.Sprintf("%d/%d", held, all)
	if len(missing) > 0 {
		s += " " + strings.Join(missing, ", ")
	}
	return s
}

// copyStateShort is a copy not made yet as the COPIES column says it:
// pending, retrying (for how long it has been failing), conflict,
// deleted (the copy was deleted on purpose: not copied again) or
// unknown.
func copyStateShort(c *ebv1.BackupCopy, now time.Time) string {
	switch c.GetState() {
	case ebv1.BackupCopyState_BACKUP_COPY_STATE_PENDING:
		return "pending"
	case ebv1.BackupCopyState_BACKUP_COPY_STATE_RETRYING:
		if t := c.GetFailingSince(); knownTime(t) {
			return "retrying " + duration.HumanDuration(now.Sub(t.AsTime()))
		}
		return "retrying"
	case ebv1.BackupCopyState_BACKUP_COPY_STATE_CONFLICT:
		return "conflict"
	case ebv1.BackupCopyState_BACKUP_COPY_STATE_SKIPPED:
		return "deleted"
	}
	return "unknown"
}

// copyStateString is a copy's state as describe and the documents
// print it: Copied, Pending, Retrying, Conflict, Skipped or Unknown.
func copyStateString(s ebv1.BackupCopyState) string { return enumWord(s, "BACKUP_COPY_STATE_") }
