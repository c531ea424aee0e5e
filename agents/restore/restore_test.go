package restore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/restore"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// The agent's log says each step of a restore, in order, with the facts
// an operator reads in the Job's log; a revision bump of 0 warns.
func TestRunLogsEachStep(t *testing.T) {
	ctx := context.Background()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	if _, err := c.Put(ctx, "marker", "logged"); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, "")
	if _, err := backup.Run(ctx, c, srv.Client, backup.Options{Endpoint: te.Endpoint, Name: "b1"}); err != nil {
		t.Fatal(err)
	}
	peer := etcdtest.FreeURL(t)
	var noBump int64
	m := snapshot.Member{Name: "m1", InitialCluster: "m1=" + peer.String(), InitialAdvertisePeerURLs: []string{peer.String()},
		DataDir: filepath.Join(t.TempDir(), "data"), BumpRevision: &noBump}
	var logged bytes.Buffer
	res, err := restore.Run(ctx, srv.Client, member.Options{Name: "b1", Member: m}, slog.New(slog.NewJSONHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for dec := json.NewDecoder(&logged); dec.More(); {
		var line struct {
			Msg      string
			Revision int64
			Took     string
			Steps    map[string]string
		}
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, line.Msg)
		if line.Msg == "member data restored" {
			if line.Revision != res.Revision {
				t.Errorf("logged revision %d, restored %d", line.Revision, res.Revision)
			}
			// Where the member's part of the recovery time went.
			if _, err := time.ParseDuration(line.Took); err != nil {
				t.Errorf("took = %q: %v", line.Took, err)
			}
			if len(line.Steps) != 3 {
				t.Errorf("steps = %v, want download, verify and rebuild", line.Steps)
			}
			for _, step := range []string{"download", "verify", "rebuild"} {
				if _, err := time.ParseDuration(line.Steps[step]); err != nil {
					t.Errorf("step %s = %q: %v", step, line.Steps[step], err)
				}
			}
		}
	}
	want := []string{"downloading backup", "backup verified", "member data restored"}
	if len(msgs) != 4 || msgs[0] != want[0] || msgs[1] != want[1] || msgs[2] != want[2] {
		t.Fatalf("logged %q, want %q and the warning of no bump", msgs, want)
	}
	servertest.MustSay(t, msgs[3], "--bump-revision 0")
	if got := etcdtest.ReadKey(t, m.DataDir, m.Name, m.InitialCluster, peer, "marker"); got != "logged" {
		t.Fatalf("marker = %q after the restore", got)
	}
}
