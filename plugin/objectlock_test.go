package plugin

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

// Backups in a location with objectLock (a real versitygw bucket with
// object lock) show when their lock ends, and survive delete and prune:
// each says "locked until DATE" and leaves them, never failing half-way.
func TestObjectLockedBackups(t *testing.T) {
	store := s3test.Start(t)
	vault := store.LockedConfig("servertest", storage.ObjectLockCompliance, 1).S3Config
	agent := &agentAs{}
	srv := servertest.StartWith(t, servertest.Options{
		Configured: []storage.LocationConfig{{Name: "vault", S3: &vault}},
		Targets: []config.Target{{Name: "cp", Endpoints: []string{"http://127.0.0.1:1"}, InsecurePlaintext: true,
			Retention: &config.Retention{KeepLast: 1}}},
		AgentGuard: agent,
	})
	addr := "--server-address=" + srv.Addr
	for _, name := range []string{"cp-1", "cp-2", "cp-3"} {
		agent.setAt("cp", name, "vault")
		agent.mu.Lock()
		agent.a.Scheduled = true
		agent.mu.Unlock()
		if _, err := srv.AgentClient.Upload(context.Background(), bytes.NewReader(etcdtest.TrailedBytes(t, 544)),
			&ebv1.UploadHeader{Name: name, Location: "vault"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Now().Add(24 * time.Hour).UTC()
	_, rows := parseTable(t, mustRun(t, "list", "-o", "wide", "--location", "vault", addr).out)
	if len(rows) != 3 {
		t.Fatalf("list: %v", rows)
	}
	for _, row := range rows {
		until, err := time.Parse(time.RFC3339, row["LOCKED-UNTIL"])
		if err != nil || until.Sub(day).Abs() > time.Minute {
			t.Errorf("%s: LOCKED-UNTIL %q, want about %s", row["NAME"], row["LOCKED-UNTIL"], day.Format(time.RFC3339))
		}
	}
	if out := mustRun(t, "describe", "cp-1", addr).out; !strings.Contains(out, "Locked Until:") || !strings.Contains(out, "the store refuses to delete it") {
		t.Errorf("describe does not say the lock:\n%s", out)
	}

	r := run(t, "delete", "cp-1", "--location", "vault", addr)
	if r.err == nil || !strings.Contains(r.errOut+r.err.Error(), "is locked until") || !strings.Contains(r.errOut+r.err.Error(), "nothing of it was deleted") {
		t.Fatalf("delete of a locked backup: %v\nstderr: %s", r.err, r.errOut)
	}

	// Retention would remove cp-1 and cp-2; the plan says why it cannot.
	_, rows = parseTable(t, mustRun(t, "prune", "--dry-run", addr).out)
	var plan []string
	for _, row := range rows {
		plan = append(plan, row["NAME"]+" "+row["PLAN"]+" "+strings.SplitN(row["RULES"], " 20", 2)[0])
	}
	if want := "cp-3 keep newest, keepLast #1;cp-2 keep locked until;cp-1 keep locked until"; strings.Join(plan, ";") != want {
		t.Errorf("prune --dry-run planned %q, want %q", plan, want)
	}
	if r := mustRun(t, "prune", addr); r.out != "" || !strings.Contains(r.errOut, "No backups to prune.") {
		t.Errorf("prune: %q %q", r.out, r.errOut)
	}
	if got := strings.Fields(mustRun(t, "list", "-o", "name", addr).out); len(got) != 3 {
		t.Fatalf("after delete and prune: %v", got)
	}

	// The ledger names the agents that stored them, and the store keeps
	// its records locked as the backups are.
	_, rows = parseTable(t, mustRun(t, "audit", "--location", "vault", addr).out)
	if len(rows) != 3 || rows[0]["WHO"] != "backup agent of job etcdbackup-system/backup-cp-1" || rows[2]["ACTION"] != "upload" {
		t.Fatalf("audit: %v", rows)
	}
	ret, err := store.Client().GetObjectRetention(context.Background(), &s3sdk.GetObjectRetentionInput{
		Bucket: aws.String(s3test.LockedBucket), Key: aws.String("servertest/ledger/" + storage.LedgerName(1))})
	if err != nil || ret.Retention == nil || string(ret.Retention.Mode) != storage.ObjectLockCompliance {
		t.Fatalf("retention of the ledger's first record: %v %+v", err, ret)
	}
}
