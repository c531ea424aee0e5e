package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// printMessage writes m as JSON or YAML with the API's field names.
func printMessage(out io.Writer, format string, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	return printJSON(out, format, b)
}

// printValue writes v as JSON or YAML.
func printValue(out io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return printJSON(out, format, b)
}

func printJSON(out io.Writer, format string, b []byte) error {
	var err error
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

var backupColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string"},
	{Name: "Location", Type: "string"},
	{Name: "Phase", Type: "string"},
	{Name: "Size", Type: "string"},
	{Name: "Age", Type: "string"},
	{Name: "Source", Type: "string", Priority: 1},
	{Name: "Revision", Type: "string", Priority: 1},
	{Name: "Compression", Type: "string", Priority: 1},
	{Name: "SHA256", Type: "string", Priority: 1},
	{Name: "Labels", Type: "string", Priority: 1},
}

// printBackups writes backups as a kubectl-style table (cli-runtime's own
// table printer), or the whole list as JSON or YAML.
func printBackups(out io.Writer, format string, list *ebv1.ListBackupsResponse, now time.Time) error {
	switch format {
	case "json", "yaml":
		return printMessage(out, format, list)
	}
	table := &metav1.Table{ColumnDefinitions: backupColumns}
	for _, b := range list.GetBackups() {
		table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{
			b.GetName(),
			b.GetLocation(),
			phaseString(b.GetPhase()),
			humanize.IBytes(uint64(b.GetSize())),
			age(b, now),
			sourceString(b.GetSource()),
			revisionString(b),
			orNone(b.GetCompression()),
			b.GetSha256(),
			labelsString(b.GetLabels()),
		}})
	}
	return printers.NewTablePrinter(printers.PrintOptions{Wide: format == "wide"}).PrintObj(table, out)
}

func age(b *ebv1.Backup, now time.Time) string {
	if b.GetCreateTime() == nil {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(b.GetCreateTime().AsTime()))
}

func phaseString(p ebv1.BackupPhase) string {
	switch p {
	case ebv1.BackupPhase_BACKUP_PHASE_RUNNING:
		return "Running"
	case ebv1.BackupPhase_BACKUP_PHASE_COMPLETED:
		return "Completed"
	case ebv1.BackupPhase_BACKUP_PHASE_FAILED:
		return "Failed"
	}
	return "Unknown"
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
