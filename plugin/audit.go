package plugin

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
)

// AuditOptions are the options of `kubectl etcdbackup audit`.
type AuditOptions struct {
	*GlobalOptions
	PrintFlags *PrintFlags
	// Since keeps the entries from then on (a duration back from now, or
	// a time).
	Since  string
	Backup string
	// Verify checks each location's whole chain and prints the verdict
	// instead of the entries.
	Verify bool

	since time.Time
	now   func() time.Time
}

// NewCmdAudit returns the audit command.
func NewCmdAudit(g *GlobalOptions) *cobra.Command {
	o := &AuditOptions{GlobalOptions: g, PrintFlags: newPrintFlags(tableFormats), now: time.Now}
	cmd := &cobra.Command{
		Use:   "audit [--since D] [--backup NAME] [--verify]",
		Short: "Print who stored, read, deleted, restored and drilled which backup, from each location's ledger",
		Long: `audit prints the ledger each storage location keeps beside its backups: an
append-only log of every upload, download, delete, prune, restore, drill and
break-glass read, with the time, the backup and its SHA-256, and who did it
(the caller's Kubernetes identity, the agent Job, the server's retention, or
"break-glass on HOST").

Each entry names the SHA-256 of the entry before it. audit reads the ledger
as stored and checks that chain here, not on the server: --verify proves
each location's chain whole, or names the first entry that was removed or
changed, and exits 5. It prints the newest entry's hash: write it down, and
a later --verify that ends elsewhere shows the end was cut. Where the
location has object lock, the store itself keeps the entries from change.

With --storage-config it reads the locations directly (break-glass).`,
		Example: examples(`
# What happened to backups in the last day, in every location
kubectl etcdbackup audit --since 24h

# Everything the ledger of location s3 says about one backup
kubectl etcdbackup audit --location s3 --backup control-plane-20261205-020000

# Prove the ledgers whole
kubectl etcdbackup audit --verify`),
		Args: cobra.NoArgs,
		RunE: runE(o),
	}
	o.PrintFlags.AddFlags(cmd, "output format of the entries")
	cmd.Flags().StringVar(&o.Since, "since", "", "only entries from then on: a duration back from now (24h, 30m) or an RFC 3339 time")
	cmd.Flags().StringVar(&o.Backup, "backup", "", "only entries about this backup")
	cmd.Flags().BoolVar(&o.Verify, "verify", false, "check each location's hash chain whole and print the verdict (exit 5 when an entry was removed or changed)")
	addStorageConfigFlag(cmd, g)
	return cmd
}

// Complete reads --since.
func (o *AuditOptions) Complete(*cobra.Command, []string) error {
	if o.Since == "" {
		return nil
	}
	if d, err := time.ParseDuration(o.Since); err == nil {
		if d <= 0 {
			return usageError(fmt.Errorf("--since %q: a duration back from now must be positive", o.Since))
		}
		o.since = o.now().Add(-d)
		return nil
	}
	t, err := time.Parse(time.RFC3339, o.Since)
	if err != nil {
		return usageError(fmt.Errorf("--since %q is neither a duration (24h) nor an RFC 3339 time (2026-12-05T00:00:00Z)", o.Since))
	}
	o.since = t
	return nil
}

// Validate checks the flags.
func (o *AuditOptions) Validate() error {
	if o.Verify && (o.Since != "" || o.Backup != "") {
		return usageError(fmt.Errorf("--verify checks each whole ledger: it takes neither --since nor --backup"))
	}
	return o.PrintFlags.Validate()
}

// Run reads each location's ledger, verifies its chain, and prints the
// entries (or, with --verify, the verdicts).
func (o *AuditOptions) Run(ctx context.Context) error {
	conn, err := o.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	locs, err := o.locationNames(ctx, conn)
	if err != nil {
		return err
	}
	var entries []auditRow
	var verdicts []LedgerVerdict
	var broken []string
	var unavailable []unavailableLocation
	for _, loc := range locs {
		recs, err := readLedger(ctx, conn, loc)
		if u, ok := asUnavailable(err); ok && o.Location == "" {
			unavailable = append(unavailable, u)
			continue
		}
		if err != nil {
			return conn.explain("read the ledger of storage location "+quote(loc), err)
		}
		r := ledger.Verify(recs)
		v := LedgerVerdict{Location: loc, Entries: len(recs), Whole: r.Problem == "", Head: r.Head, Problem: r.Problem, At: r.At}
		verdicts = append(verdicts, v)
		if r.Problem != "" {
			broken = append(broken, fmt.Sprintf("location %q: %s", loc, r.Problem))
			if !o.Verify {
				fmt.Fprintf(o.ErrOut, "Warning: the ledger of location %q is not whole: %s; the entries after it are not vouched for and are not shown\n", loc, r.Problem)
			}
		}
		for _, e := range r.Entries {
			if (o.Backup == "" || e.Backup == o.Backup) && !e.Time.Before(o.since) {
				entries = append(entries, auditRow{loc, e})
			}
		}
	}
	if o.Verify {
		if err := o.PrintFlags.Print(o.Out, ledgerVerdictList(verdicts), func(w io.Writer) error {
			for _, v := range verdicts {
				fmt.Fprintln(w, v.String())
			}
			return nil
		}); err != nil {
			return err
		}
	} else if err := o.PrintFlags.Print(o.Out, auditEntryList(entries), func(w io.Writer) error {
		return printAuditTable(w, entries, o.PrintFlags.Wide(), o.PrintFlags.NoHeaders)
	}); err != nil {
		return err
	}
	o.warnUnavailable(unavailable, "its ledger is not read")
	if len(broken) > 0 {
		return withCode(ExitFailed, fmt.Errorf("%s: entries were removed from or changed in storage since they were written; "+
			"compare with a copy of the ledger held elsewhere, and rotate the storage credentials (docs/security.md)", strings.Join(broken, "; ")))
	}
	if len(unavailable) > 0 {
		return withCode(ExitIncomplete, errAlreadyReported)
	}
	return nil
}

// readLedger reads location loc's whole ledger, a page at a time.
func readLedger(ctx context.Context, conn *Connection, loc string) ([]ledger.Record, error) {
	var out []ledger.Record
	after := uint64(0)
	for {
		resp, err := conn.Backups.GetLedger(ctx, &ebv1.GetLedgerRequest{Location: loc, AfterSeq: after})
		if err != nil {
			return nil, err
		}
		for _, r := range resp.GetRecords() {
			out = append(out, ledger.Record{Seq: r.GetSeq(), Data: r.GetData()})
			after = r.GetSeq()
		}
		if !resp.GetMore() || len(resp.GetRecords()) == 0 {
			return out, nil
		}
	}
}

type auditRow struct {
	location string
	e        ledger.Entry
}

var auditColumns = []metav1.TableColumnDefinition{
	{Name: "Location", Type: "string"},
	{Name: "Seq", Type: "integer"},
	{Name: "Time", Type: "string"},
	{Name: "Action", Type: "string"},
	{Name: "Backup", Type: "string"},
	{Name: "Who", Type: "string"},
	{Name: "Detail", Type: "string", Priority: 1},
	{Name: "SHA256", Type: "string", Priority: 1},
}

func printAuditTable(w io.Writer, rows []auditRow, wide, noHeaders bool) error {
	table := &metav1.Table{ColumnDefinitions: auditColumns}
	for _, r := range rows {
		table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{
			r.location, r.e.Seq, r.e.Time.UTC().Format(time.RFC3339), r.e.Action, orNone(r.e.Backup), r.e.Who, orNone(r.e.Detail), orNone(r.e.SHA256),
		}})
	}
	return printers.NewTablePrinter(printers.PrintOptions{Wide: wide, NoHeaders: noHeaders}).PrintObj(table, w)
}

// AuditEntryList is what `audit -o json|yaml` prints: the entries, oldest
// first in each location.
type AuditEntryList struct {
	metav1.TypeMeta `json:",inline"`
	Items           []AuditEntry `json:"items"`
}

// AuditEntry is a ledger entry as stored, and its location.
type AuditEntry struct {
	Location string `json:"location"`
	ledger.Entry
}

func (l *AuditEntryList) DeepCopyObject() runtime.Object {
	d := *l
	d.Items = append([]AuditEntry(nil), l.Items...)
	return &d
}

func auditEntryList(rows []auditRow) *AuditEntryList {
	l := &AuditEntryList{TypeMeta: typeMeta("AuditEntryList"), Items: []AuditEntry{}}
	for _, r := range rows {
		l.Items = append(l.Items, AuditEntry{Location: r.location, Entry: r.e})
	}
	return l
}

// LedgerVerdict is `audit --verify`'s word on one location's ledger.
type LedgerVerdict struct {
	Location string `json:"location"`
	Entries  int    `json:"entries"`
	Whole    bool   `json:"whole"`
	// Head is the SHA-256 of the newest entry of a whole chain.
	Head string `json:"head,omitempty"`
	// Problem is the first break, At the entry removed or changed.
	Problem string `json:"problem,omitempty"`
	At      uint64 `json:"at,omitempty"`
}

func (v LedgerVerdict) String() string {
	switch {
	case !v.Whole:
		return fmt.Sprintf("location %s: BROKEN at entry %d: %s", v.Location, v.At, v.Problem)
	case v.Entries == 0:
		return fmt.Sprintf("location %s: no entries", v.Location)
	}
	return fmt.Sprintf("location %s: %d entries, the chain is whole; newest entry %d has SHA-256 %s", v.Location, v.Entries, v.Entries, v.Head)
}

// LedgerVerdictList is what `audit --verify -o json|yaml` prints.
type LedgerVerdictList struct {
	metav1.TypeMeta `json:",inline"`
	Items           []LedgerVerdict `json:"items"`
}

func (l *LedgerVerdictList) DeepCopyObject() runtime.Object {
	d := *l
	d.Items = append([]LedgerVerdict(nil), l.Items...)
	return &d
}

func ledgerVerdictList(vs []LedgerVerdict) *LedgerVerdictList {
	return &LedgerVerdictList{TypeMeta: typeMeta("LedgerVerdictList"), Items: append([]LedgerVerdict{}, vs...)}
}
