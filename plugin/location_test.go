package plugin

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3/s3test"
)

func TestLocationCheck(t *testing.T) {
	addr := startServer(t)
	r := mustRun(t, addr, "location", "check", "default")
	header, rows := parseTable(t, r.out)
	if !slices.Equal(header, []string{"STEP", "RESULT", "DURATION", "DETAIL/ADVICE"}) {
		t.Fatalf("header %q", header)
	}
	var steps []string
	for _, row := range rows {
		steps = append(steps, row["STEP"]+"="+row["RESULT"])
	}
	want := []string{"write=ok", "multipart write=skipped", "ranged read=ok", "list=ok",
		"conditional create=ok", "checksums=skipped", "object lock=skipped", "delete=ok"}
	if !slices.Equal(steps, want) {
		t.Fatalf("steps %q, want %q\n%s", steps, want, r.out)
	}
	if rows[6]["DETAIL/ADVICE"] != "the location does not ask for object lock" {
		t.Errorf("object lock row: %q", rows[6]["DETAIL/ADVICE"])
	}

	var doc LocationCheck
	if err := json.Unmarshal([]byte(mustRun(t, addr, "location", "check", "default", "-o", "json").out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Kind != "LocationCheck" || doc.APIVersion != "etcdbackup.io/v1" || doc.Metadata.Name != "default" ||
		doc.Status.Type != "filesystem" || !doc.Status.OK || len(doc.Status.Steps) != 8 || doc.Status.Steps[0].Name != "write" {
		t.Fatalf("-o json: %+v", doc)
	}
	if r := mustRun(t, addr, "location", "check", "default", "-o", "name"); r.out != "locationcheck/default\n" {
		t.Errorf("-o name: %q", r.out)
	}

	// location alone is its help; anything else after it is a usage error.
	if r := mustRun(t, addr, "location"); !strings.Contains(r.out, "Available Commands:") || !strings.Contains(r.out, "check") {
		t.Errorf("location alone:\n%s", r.out)
	}
	r = mustFail(t, `unknown command "chek" for "kubectl etcdbackup location"`, addr, "location", "chek")
	if ExitCode(r.err) != ExitUsage {
		t.Errorf("location chek: exit %d", ExitCode(r.err))
	}
	r = mustFail(t, "accepts 1 arg(s), received 0", addr, "location", "check")
	if ExitCode(r.err) != ExitUsage {
		t.Errorf("location check: exit %d", ExitCode(r.err))
	}
	r = mustFail(t, `--location "s3" and NAME "default" name different locations`, addr, "--location", "s3", "location", "check", "default")
	if ExitCode(r.err) != ExitUsage {
		t.Errorf("--location s3 location check default: exit %d", ExitCode(r.err))
	}
	r = mustFail(t, `storage location "nope" does not exist on this server`, addr, "location", "check", "nope")
	if ExitCode(r.err) != ExitNotFound {
		t.Errorf("location check nope: exit %d", ExitCode(r.err))
	}
}

// A failed step is exit 5, its row giving the store's error and the
// advice, the error naming the step: a real versitygw whose bucket policy
// denies the location's credentials s3:DeleteObject.
func TestLocationCheckFails(t *testing.T) {
	store := s3test.Start(t)
	user := store.UserDenied(t, "s3:DeleteObject")
	cfg := store.ConfigAs("plugin", user).S3Config
	srv := servertest.StartWith(t, servertest.Options{Configured: []storage.LocationConfig{{Name: "s3", S3: &cfg}}})
	addr := "--server-address=" + srv.Addr
	r := mustFail(t, `storage location "s3" failed the check at: delete; each failed step says what to change`, addr, "location", "check", "s3")
	if ExitCode(r.err) != ExitFailed {
		t.Errorf("exit %d, want %d", ExitCode(r.err), ExitFailed)
	}
	t.Logf("location check s3:\n%s%s", r.out, r.err)
	_, rows := parseTable(t, r.out)
	last := rows[len(rows)-1]
	if last["STEP"] != "delete" || last["RESULT"] != "failed" || !strings.Contains(last["DETAIL/ADVICE"], "AccessDenied") ||
		!strings.Contains(last["DETAIL/ADVICE"], "; the credentials may not delete objects: grant s3:DeleteObject") {
		t.Fatalf("delete row %q\n%s", last, r.out)
	}
	for _, row := range rows[:len(rows)-1] {
		if row["RESULT"] == "failed" {
			t.Errorf("step %q failed too:\n%s", row["STEP"], r.out)
		}
	}
}
