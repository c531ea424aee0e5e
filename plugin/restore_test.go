package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// runRestoreAt is run for the restore command, its clock reading each of
// readings (after a fixed start) in turn and the last for good: a restore
// reads it once per step it ends, so the durations it prints are exact.
// Of the root's flags, only --server-address is given in these tests;
// the other globals are NewCmdRoot's defaults.
func runRestoreAt(t *testing.T, readings []time.Duration, args ...string) result {
	t.Helper()
	t0 := time.Date(2026, 1, 31, 2, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := func() time.Time {
		// The download's end is read on the download's own goroutine.
		mu.Lock()
		defer mu.Unlock()
		d := readings[0]
		if len(readings) > 1 {
			readings = readings[1:]
		}
		return t0.Add(d)
	}
	var out, errOut bytes.Buffer
	g := &GlobalOptions{ConfigFlags: genericclioptions.NewConfigFlags(true), ServerService: "etcdbackup", ConnectTimeout: 30 * time.Second,
		RetryTimeout: client.DefaultRetryTimeout, IOStreams: genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: &out, ErrOut: &errOut}}
	root := &cobra.Command{Use: "kubectl-etcdbackup", SilenceUsage: true, SilenceErrors: true}
	root.PersistentFlags().StringVar(&g.ServerAddress, "server-address", "", "")
	root.AddCommand(newCmdRestore(&RestoreOptions{GlobalOptions: g, now: now}))
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return result{out: out.String(), errOut: errOut.String(), err: err}
}

func TestRoundElapsed(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                     "0s",
		40 * time.Millisecond:                 "0s",
		450 * time.Millisecond:                "0.5s",
		6 * time.Second:                       "6s",
		6340 * time.Millisecond:               "6.3s",
		9960 * time.Millisecond:               "10s",
		41*time.Second + 499*time.Millisecond: "41s",
		83*time.Second + 600*time.Millisecond: "1m24s",
		2*time.Hour + 3*time.Second:           "2h0m3s",
	} {
		if got := roundElapsed(d); got != want {
			t.Errorf("roundElapsed(%s) = %q, want %q", d, got, want)
		}
	}
}

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
	r = runRestoreAt(t, []time.Duration{0, 2*time.Minute + 3*time.Second}, w.addr, "restore", "b1", "--target", "app", "--bump-revision", "7", "--wait")
	js := <-agent
	if r.err != nil {
		t.Fatalf("restore --wait: %v\n%s", r.err, r.errOut)
	}
	// The recovery time ends the output, from the command on.
	if want := "\ntarget \"app\" restored in 2m3s, from the command to every member's Job succeeded\n"; !strings.HasSuffix(r.out, want) {
		t.Errorf("restore --wait does not end with %q:\n%s", want, r.out)
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

// An in-cluster restore's elapsed time: on stderr with -o json, whose
// stdout stays one document; "restore failed after" when a member's Job
// failed; nothing while a restore without --wait still runs.
func TestRestoreTargetElapsed(t *testing.T) {
	w := newAgentWorld(t, "cp")
	for _, name := range []string{"b1", "b2", "b3"} {
		file, _, _ := writeSnapshot(t, name, smallSnapshot)
		mustRun(t, w.addr, "upload", file)
	}
	finish := func(backup string, m1ok bool) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for _, j := range w.jobsOf(t, "app", "restore-agent", backup, 2) {
				w.finish(t, j, m1ok || j.Annotations["etcdbackup.io/member"] == "m0", "restore m1: disk full")
			}
		}()
		return done
	}

	done := finish("b1", true)
	r := runRestoreAt(t, []time.Duration{0, 95 * time.Second}, w.addr, "restore", "b1", "--target", "app", "--wait", "-o", "json")
	<-done
	if r.err != nil {
		t.Fatalf("restore --wait -o json: %v\n%s", r.err, r.errOut)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.out), &doc); err != nil || doc["kind"] != "Restore" {
		t.Errorf("restore --wait -o json stdout is not one Restore (%v):\n%s", err, r.out)
	}
	if want := "target \"app\" restored in 1m35s, from the command to every member's Job succeeded\n"; !strings.HasSuffix(r.errOut, want) {
		t.Errorf("restore --wait -o json stderr does not end with %q:\n%s", want, r.errOut)
	}

	done = finish("b2", false)
	r = runRestoreAt(t, []time.Duration{0, 12 * time.Second}, w.addr, "restore", "b2", "--target", "app", "--wait")
	<-done
	if r.err == nil || ExitCode(r.err) != ExitFailed || !strings.Contains(r.err.Error(), "restore of member m1 failed") {
		t.Fatalf("failed restore --wait: %v (exit %d)\n%s", r.err, ExitCode(r.err), r.errOut)
	}
	if !strings.HasSuffix(r.errOut, "\nrestore failed after 12s\n") || strings.Contains(r.out, "restored in") {
		t.Errorf("failed restore --wait: stdout\n%s\nstderr\n%s", r.out, r.errOut)
	}

	r = runRestoreAt(t, []time.Duration{0, time.Minute}, w.addr, "restore", "b3", "--target", "app")
	if r.err != nil || !strings.Contains(r.out, "started; follow it with") || strings.Contains(r.out+r.errOut, " in 1m") {
		t.Errorf("restore without --wait: %v\nstdout\n%s\nstderr\n%s", r.err, r.out, r.errOut)
	}
}
