package plugin

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Every upload, download and delete is in the location's ledger, with
// who did it; a break-glass read is too, naming the host. audit prints
// it, filters it, and --verify proves the chain whole — then, after one
// entry is edited in storage, names that entry and exits 5.
func TestAudit(t *testing.T) {
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	f, _, _ := writeSnapshot(t, "cp-1", smallSnapshot)
	mustRun(t, "upload", f, "--name", "cp-1", addr)
	mustRun(t, "upload", f, "--name", "cp-2", addr)
	mustRun(t, "download", "cp-1", "-o", filepath.Join(t.TempDir(), "cp-1.db"), addr)
	mustRun(t, "delete", "cp-2", "--yes", addr)

	_, rows := parseTable(t, mustRun(t, "audit", addr).out)
	var got []string
	for _, r := range rows {
		got = append(got, r["SEQ"]+" "+r["ACTION"]+" "+r["BACKUP"]+" "+r["WHO"])
	}
	want := []string{"1 upload cp-1 port-forward", "2 upload cp-2 port-forward", "3 download cp-1 port-forward", "4 delete cp-2 port-forward"}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Fatalf("audit:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if out := mustRun(t, "audit", "--backup", "cp-2", "-o", "wide", addr).out; strings.Count(out, "cp-2") != 2 || strings.Contains(out, "cp-1") {
		t.Errorf("audit --backup cp-2:\n%s", out)
	}
	if out := mustRun(t, "audit", "--since", "2099-01-01T00:00:00Z", addr).out; strings.Contains(out, "cp-") {
		t.Errorf("audit --since in the future:\n%s", out)
	}
	if out := mustRun(t, "audit", "-o", "json", addr).out; !strings.Contains(out, `"kind": "AuditEntryList"`) || !strings.Contains(out, `"action": "download"`) {
		t.Errorf("audit -o json:\n%s", out)
	}
	mustFail(t, "--since", "audit", "--since", "yesterday", addr)
	mustFail(t, "--verify checks each whole ledger", "audit", "--verify", "--backup", "cp-1", addr)

	r := mustRun(t, "audit", "--verify", addr)
	if !strings.Contains(r.out, "location default: 4 entries, the chain is whole; newest entry 4 has SHA-256 ") {
		t.Fatalf("audit --verify: %q", r.out)
	}

	// A break-glass read is recorded, naming the host.
	srv.Stop()
	useBreakGlass(t)
	cfg := writeConfig(t, fmt.Sprintf("locations:\n  - name: default\n    filesystem: {path: %s}\n", srv.Dir))
	mustRun(t, "download", "cp-1", "--storage-config", cfg, "-o", filepath.Join(t.TempDir(), "again.db"))
	host, _ := os.Hostname()
	_, rows = parseTable(t, mustRun(t, "audit", "--storage-config", cfg).out)
	if last := rows[len(rows)-1]; last["SEQ"] != "5" || last["ACTION"] != "break-glass read" || last["WHO"] != "break-glass on "+host {
		t.Fatalf("after a break-glass read, the last entry is %v", last)
	}

	// Who downloaded cp-1 is rewritten in storage.
	entry := filepath.Join(srv.Dir, "ledger", storage.LedgerName(3))
	b, err := os.ReadFile(entry)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(entry, bytes.Replace(b, []byte(`"port-forward"`), []byte(`"user nobody"`), 1), 0o640); err != nil {
		t.Fatal(err)
	}
	r = run(t, "audit", "--verify", "--storage-config", cfg)
	if r.err == nil || ExitCode(r.err) != ExitFailed || !strings.Contains(r.out, "BROKEN at entry 3: entry 3 was changed") {
		t.Fatalf("audit --verify after an edit: %v (exit %d)\n%s", r.err, ExitCode(r.err), r.out)
	}
}
