package plugin

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

func TestPrune(t *testing.T) {
	agent := &agentAs{}
	srv := servertest.StartWith(t, servertest.Options{Targets: []config.Target{{
		Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true, Retention: &config.Retention{KeepLast: 2},
	}}, AgentGuard: agent})
	addr := "--server-address=" + srv.Addr
	// Scheduled backups are what the schedule's agents store (the server
	// marks them), an on-demand one what another agent of cp stores.
	store := func(name string, scheduled bool) {
		t.Helper()
		agent.set("cp", name, scheduled)
		if _, err := srv.AgentClient.Upload(context.Background(), bytes.NewReader(etcdtest.TrailedBytes(t, 544)),
			&ebv1.UploadHeader{Name: name}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"cp-1", "cp-2", "cp-3", "cp-4"} {
		store(name, true)
	}
	store("by-hand", false)
	// An upload is none of cp's, whatever it is called.
	f, _, _ := writeSnapshot(t, "cp-0", smallSnapshot)
	mustRun(t, "upload", f, "--name", "cp-0", addr)
	names := func() []string {
		out := strings.Fields(mustRun(t, "list", "-o", "name", addr).out)
		slices.Sort(out)
		return out
	}
	all := []string{"backup/by-hand", "backup/cp-0", "backup/cp-1", "backup/cp-2", "backup/cp-3", "backup/cp-4"}

	// The dry run's plan: every backup counted, what it does with each
	// and the rules that keep it.
	r := mustRun(t, "prune", "--dry-run", addr)
	_, rows := parseTable(t, r.out)
	var listed []string
	for _, row := range rows {
		listed = append(listed, row["NAME"]+" "+row["PLAN"]+" "+row["RULES"])
	}
	want := []string{"cp-4 keep newest, keepLast #1", "cp-3 keep keepLast #2", "cp-2 remove <none>", "cp-1 remove <none>"}
	if !slices.Equal(listed, want) || !strings.Contains(r.errOut, "Dry run: the backups marked remove would be removed, nothing was.") {
		t.Fatalf("prune --dry-run planned %q, want %q\nstderr: %s", listed, want, r.errOut)
	}
	// A script's view of a dry run stays the removed backups.
	if r := mustRun(t, "prune", "--dry-run", "-o", "name", addr); r.out != "backup/cp-2\nbackup/cp-1\n" {
		t.Fatalf("prune --dry-run -o name: %q", r.out)
	}
	if got := names(); !slices.Equal(got, all) {
		t.Fatalf("after --dry-run: %q, want all of %q", got, all)
	}

	r = mustRun(t, "prune", "-o", "name", addr)
	if r.out != "backup/cp-2\nbackup/cp-1\n" {
		t.Fatalf("prune -o name: %q", r.out)
	}
	if got := names(); !slices.Equal(got, []string{"backup/by-hand", "backup/cp-0", "backup/cp-3", "backup/cp-4"}) {
		t.Fatalf("after prune: %q", got)
	}
	// Each removal is in the ledger, with who asked and the rule.
	if out := mustRun(t, "audit", "--backup", "cp-2", "-o", "wide", addr).out; !strings.Contains(out, "prune") || !strings.Contains(out, "retention of target cp: kept by no rule") {
		t.Errorf("audit of a pruned backup:\n%s", out)
	}
	r = mustRun(t, "prune", addr)
	if r.out != "" || !strings.Contains(r.errOut, "No backups to prune.") {
		t.Fatalf("second prune: %q %q", r.out, r.errOut)
	}
	// With --all the on-demand one counts too: it is the newest, so
	// keepLast 2 now leaves it and cp-4.
	mustRun(t, "prune", "--all", "--target", "cp", addr)
	if got := names(); !slices.Equal(got, []string{"backup/by-hand", "backup/cp-0", "backup/cp-4"}) {
		t.Fatalf("after prune --all: %q", got)
	}
	mustFail(t, `etcd target "nope" is not configured`, "prune", "--target", "nope", addr)
}
