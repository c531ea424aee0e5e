package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func TestRestoreFlagCombinations(t *testing.T) {
	for _, tc := range []struct {
		o    RestoreOptions
		want string
	}{
		{RestoreOptions{}, "say what to restore"},
		{RestoreOptions{Name: "b"}, "--local"},
		{RestoreOptions{Name: "b", Local: true, Target: "t"}, "not both"},
		{RestoreOptions{Name: "b", Target: "t", FromFile: "f"}, "--from-file goes with --local"},
		{RestoreOptions{Name: "b", Target: "t", WorkDir: "/w"}, "server's configuration"},
		{RestoreOptions{Name: "b", Local: true, WaitOptions: WaitOptions{Wait: true}}, "--wait goes with --target"},
		{RestoreOptions{Name: "b", Target: "t", WaitOptions: WaitOptions{Wait: true}, DryRun: true}, ""},
		{RestoreOptions{GlobalOptions: &GlobalOptions{StorageConfig: "s.yaml"}, Name: "b", Target: "t"}, "--storage-config reads a backup on this machine"},
		{RestoreOptions{GlobalOptions: &GlobalOptions{StorageConfig: "s.yaml"}, Name: "b", Local: true, FromFile: "f"}, "give one"},
		// In the cluster to a point: NAME optional, --target required.
		{RestoreOptions{Target: "t", ToRevision: 5, AllowLeaseLoss: true}, ""},
		{RestoreOptions{Name: "b", Target: "t", ToTime: "2026-01-01T00:00:00Z", DryRun: true}, ""},
		{RestoreOptions{ToRevision: 5}, "need --target T"},
		{RestoreOptions{Target: "t", AllowLeaseLoss: true, Name: "b"}, "--allow-lease-loss goes with"},
		{RestoreOptions{Target: "t", ToRevision: 5, ToTime: "2026-01-01T00:00:00Z"}, "not both"},
	} {
		o := tc.o
		err := o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}

// localRestoreArgs are the flags of a valid --local restore into dataDir.
func localRestoreArgs(dataDir string) []string {
	return []string{
		"--local", "--data-dir", dataDir, "--member-name", "m1",
		"--initial-cluster", "m1=http://10.0.0.1:2380", "--initial-advertise-peer-urls", "http://10.0.0.1:2380",
	}
}

// Validate reads nothing: a data directory that holds data is refused by
// Run, before any download (nothing listens at the server address).
func TestRestoreLocalRefusesNonEmptyDataDirBeforeDownload(t *testing.T) {
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, "member"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o := RestoreOptions{Name: "b", Local: true, Member: snapshot.Member{
		DataDir: dataDir, Name: "m1", InitialCluster: "m1=http://10.0.0.1:2380", InitialAdvertisePeerURLs: []string{"http://10.0.0.1:2380"},
	}}
	if err := o.Validate(); err != nil {
		t.Fatalf("Validate looked at the data directory: %v", err)
	}

	args := append([]string{"--server-address", nowhere, "restore", "b"}, localRestoreArgs(dataDir)...)
	for _, extra := range [][]string{nil, {"--dry-run"}} {
		r := mustFail(t, "not empty", append(args, extra...)...)
		if !strings.Contains(r.err.Error(), "move-aside") || !strings.Contains(r.err.Error(), dataDir) {
			t.Errorf("%v: error does not name the directory and --move-aside: %v", extra, r.err)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(dataDir))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".etcdbackup-restore-") {
			t.Errorf("refused restore created work directory %s", e.Name())
		}
	}
}

func TestRestoreLocalDryRun(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "etcd")
	r := mustRun(t, append([]string{"--server-address", nowhere, "restore", "b", "--dry-run"}, localRestoreArgs(dataDir)...)...)
	work := filepath.Join(filepath.Dir(dataDir), ".etcdbackup-restore-b")
	want := fmt.Sprintf("would download backup %q to %s, verify it, and rebuild %s for member %q of cluster %s (peer URLs %s)\n",
		"b", work, dataDir, "m1", "m1=http://10.0.0.1:2380", "http://10.0.0.1:2380") +
		"after restoring: revision bumped by 1000000000 and marked compacted (watchers and informers will relist)\n"
	if r.out != want {
		t.Fatalf("dry run: %q, want %q", r.out, want)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Fatalf("dry run created %s: %v", work, err)
	}
}

func TestRestoreFlagErrorsThroughCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"restore", "b"}, "say where to restore"},
		{[]string{"restore", "b", "--local", "--data-dir", "/d"}, "restore needs the member name, initial cluster, initial advertise peer URLs (flags --data-dir, --member-name, --initial-cluster, --initial-advertise-peer-urls)"},
		{[]string{"restore", "b", "--local", "--data-dir", "/d", "--member-name", "m1", "--initial-cluster", "other=http://x:2380", "--initial-advertise-peer-urls", "http://x:2380"}, `initial cluster "other=http://x:2380" does not name member "m1"`},
		{[]string{"restore", "b", "--target", "t", "--data-dir", "/d"}, "drop --data-dir"},
		{[]string{"restore", "b", "--target", "t", "--timeout", "x"}, `invalid argument "x" for "--timeout"`},
		{[]string{"restore", "b", "--target", "t", "--bump-revision", "-5"}, "--bump-revision -5 is negative"},
		{[]string{"restore", "b", "--target", "t", "--bump-revision", "1e9"}, `invalid argument "1e9" for "--bump-revision"`},
		{[]string{"restore"}, "say what to restore"},
		{[]string{"restore", "a", "b"}, "accepts between 0 and 1 arg(s), received 2"},
		{[]string{"restore", "--local", "--to-revision", "5", "--data-dir", "/d", "--member-name", "m1", "--initial-cluster", "m1=http://x:2380", "--initial-advertise-peer-urls", "http://x:2380"}, "need --target T"},
		{[]string{"restore", "b", "--target", "t", "--to-revision", "5", "--to-time", "2026-01-01T00:00:00Z"}, "not both"},
		{[]string{"restore", "b", "--local", "--to-time", "yesterday"}, "is not a time in RFC 3339"},
	} {
		r := run(t, append([]string{"--server-address", nowhere}, tc.args...)...)
		if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to contain %q", tc.args, r.err, tc.want)
		}
	}
}

// --target goes to the server; this one has no restore agents.
func TestRestoreTargetAsksServer(t *testing.T) {
	addr := startServer(t)
	r := run(t, addr, "restore", "b", "--target", "t", "--dry-run")
	if r.err == nil || !strings.HasPrefix(r.err.Error(), `restore "b" into target "t": this server cannot launch restore agents`) || !strings.Contains(r.err.Error(), "--local") {
		t.Fatalf("restore --target: %v", r.err)
	}
}

// The in-cluster restore sends --bump-revision to the server, whose plan,
// Jobs and answers carry it back: the dry run shows what each member
// would get, the restore Jobs pass it to their agents, and --wait says
// what was done.
func TestRestoreTargetBumpRevision(t *testing.T) {
	w := newAgentWorld(t, "cp")
	file, _, _ := writeSnapshot(t, "b1", smallSnapshot)
	mustRun(t, w.addr, "upload", file)

	r := mustRun(t, w.addr, "restore", "b1", "--target", "app", "--dry-run")
	if n := strings.Count(r.out, "\n    after restoring: revision bumped by 1000000000 and marked compacted (watchers and informers will relist)\n"); n != 2 {
		t.Fatalf("dry run plan shows the default bump for %d of 2 members:\n%s", n, r.out)
	}
	r = mustRun(t, w.addr, "restore", "b1", "--target", "app", "--dry-run", "--bump-revision", "0")
	if n := strings.Count(r.out, "\n    after restoring: revisions kept as in the snapshot (--bump-revision 0), nothing marked compacted: "); n != 2 {
		t.Fatalf("dry run plan with --bump-revision 0:\n%s", r.out)
	}
	r = mustRun(t, w.addr, "restore", "b1", "--target", "app", "--dry-run", "--bump-revision", "0", "-o",
		"jsonpath={.spec.bumpRevision} {.status.members[*].bumpRevision} {.status.members[*].markCompacted}")
	if r.out != "0 0 0 false false" {
		t.Fatalf("restore --dry-run -o jsonpath = %q", r.out)
	}
	r = run(t, w.addr, "restore", "b1", "--target", "app", "--bump-revision", "-1")
	if r.err == nil || ExitCode(r.err) != ExitUsage || !strings.Contains(r.err.Error(), "--bump-revision -1 is negative") {
		t.Fatalf("negative bump: %v (exit %d)", r.err, ExitCode(r.err))
	}

	agent := make(chan []batchv1.Job)
	go func() {
		js := w.jobsOf(t, "app", "restore-agent", "b1", 2)
		for _, j := range js {
			w.finish(t, j, true, "")
		}
		agent <- js
	}()
	r = run(t, w.addr, "restore", "b1", "--target", "app", "--bump-revision", "7", "--wait")
	js := <-agent
	if r.err != nil {
		t.Fatalf("restore --wait: %v\n%s", r.err, r.errOut)
	}
	for _, j := range js {
		if args := j.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--bump-revision=7") {
			t.Errorf("job %s: args %q lack --bump-revision=7", j.Name, args)
		}
	}
	for _, m := range []string{"m0", "m1"} {
		want := fmt.Sprintf("member %s restored into pvc/data-%s (data dir \".\"); revision bumped by 7 and marked compacted (watchers and informers will relist)\n", m, m)
		if !strings.Contains(r.out, want) {
			t.Errorf("restore --wait output lacks %q:\n%s", want, r.out)
		}
	}
}
