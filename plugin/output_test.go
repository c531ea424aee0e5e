package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dustin/go-humanize"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tunnel"
)

// runIn is run with stdin given, and stdin a terminal or not.
func runIn(t *testing.T, stdin string, terminal bool, args ...string) result {
	t.Helper()
	saved := isTerminal
	isTerminal = func(io.Reader) bool { return terminal }
	defer func() { isTerminal = saved }()
	streams, in, out, errOut := genericiooptions.NewTestIOStreams()
	in.WriteString(stdin)
	cmd := NewCmdRoot(streams)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return result{out: out.String(), errOut: errOut.String(), err: err}
}

func TestOutputFormats(t *testing.T) {
	addr := startServer(t)
	// Two sizes, so that each backup's own is seen.
	file, data, sum := writeSnapshot(t, "b1", bigSnapshot)
	mustRun(t, addr, "upload", file, "--labels", "env=test")
	file2, data2, _ := writeSnapshot(t, "b2", smallSnapshot)
	mustRun(t, addr, "upload", file2)
	// custom-columns pads each column to its widest cell and 3 spaces.
	bytesCol := func(cell string) string {
		w := max(len("BYTES"), len(fmt.Sprint(len(data))), len(fmt.Sprint(len(data2)))) + 3
		return fmt.Sprintf("%-*s", w, cell)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "-o", "name"}, "backup/b2\nbackup/b1\n"},
		{[]string{"get", "b1", "-o", "name"}, "backup/b1\n"},
		{[]string{"get", "b1", "-o", "jsonpath={.status.sizeBytes} {.status.sha256} {.status.phase}"}, fmt.Sprintf("%d %s Completed", len(data), sum)},
		{[]string{"list", "-o", `jsonpath={range .items[?(@.metadata.labels.env=="test")]}{.metadata.name}{"\n"}{end}`}, "b1\n"},
		{[]string{"list", "-o", `go-template={{range .items}}{{.metadata.name}}={{.status.sizeBytes}} {{end}}`}, fmt.Sprintf("b2=%d b1=%d ", len(data2), len(data))},
		{[]string{"list", "-o", "custom-columns=NAME:.metadata.name,BYTES:.status.sizeBytes,ENV:.metadata.labels.env"},
			"NAME   " + bytesCol("BYTES") + "ENV\nb2     " + bytesCol(fmt.Sprint(len(data2))) + "<none>\nb1     " + bytesCol(fmt.Sprint(len(data))) + "test\n"},
		{[]string{"list", "-o", "custom-columns=NAME:{.metadata.name}", "--no-headers"}, "b2\nb1\n"},
		{[]string{"get", "b1", "-o", "custom-columns=SHA:.status.sha256"}, "SHA\n" + sum + "\n"},
	} {
		if r := mustRun(t, append([]string{addr}, tc.args...)...); r.out != tc.want {
			t.Errorf("%v:\n got %q\nwant %q", tc.args, r.out, tc.want)
		}
	}

	// --no-headers on the table and the wide table.
	for _, f := range []string{"table", "wide"} {
		r := mustRun(t, addr, "list", "--no-headers", "-o", f)
		lines := strings.Split(strings.TrimSpace(r.out), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "b2 ") || strings.Contains(r.out, "NAME") {
			t.Errorf("list --no-headers -o %s:\n%s", f, r.out)
		}
	}

	// A bad expression is a usage error before the server is asked.
	for _, args := range [][]string{
		{"list", "-o", "jsonpath={.items[}"},
		{"list", "-o", "custom-columns=NAME"},
		{"list", "-o", "custom-columns="},
		{"version", "-o", "custom-columns=A:.b"},
	} {
		r := run(t, append([]string{"--server-address", nowhere}, args...)...)
		if r.err == nil || ExitCode(r.err) != ExitUsage || strings.Contains(r.err.Error(), "cannot reach") {
			t.Errorf("%v: %v (exit %d), want a usage error", args, r.err, ExitCode(r.err))
		}
	}

	// An empty list: nothing on stdout for names and templates.
	for _, f := range []string{"name", "jsonpath={.items[*].metadata.name}"} {
		r := mustRun(t, addr, "list", "-l", "env=none", "-o", f)
		if r.out != "" {
			t.Errorf("empty list -o %s = %q", f, r.out)
		}
	}
}

// version and verify print Kubernetes-style kinds too.
func TestVersionAndVerifyObjects(t *testing.T) {
	addr := startServer(t)
	var v Version
	if err := yaml.Unmarshal([]byte(mustRun(t, addr, "version", "-o", "yaml").out), &v); err != nil {
		t.Fatal(err)
	}
	if v.APIVersion != "etcdbackup.io/v1" || v.Kind != "Version" || v.Server == nil || len(v.Server.Locations) != 1 || v.Server.Locations[0].Name != "default" {
		t.Fatalf("version -o yaml: %+v", v)
	}
	if r := mustRun(t, addr, "version", "-o", "jsonpath={.server.locations[0].type}"); r.out != "filesystem" {
		t.Fatalf("version -o jsonpath = %q", r.out)
	}
}

func TestDescribe(t *testing.T) {
	addr := startServer(t)
	file, data, sum := writeSnapshot(t, "b1", bigSnapshot) // with keys, at a revision
	st, err := snapshot.Check(file)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, addr, "upload", file, "--labels", "env=test,team=etcd")
	r := mustRun(t, addr, "describe", "b1")
	fields := map[string]string{}
	for _, l := range strings.Split(r.out, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	for k, want := range map[string]string{
		"Name":        "b1",
		"Location":    "default",
		"Phase":       "Completed",
		"Labels":      "env=test,team=etcd",
		"Kind":        "upload",
		"Description": "b1",
		"Stored Size": fmt.Sprintf("%s (%d bytes)", humanize.IBytes(uint64(len(data))), len(data)),
		"Compression": "<none>",
		"Encryption":  "<none>",
		"SHA256":      sum,
		// What upload read from the snapshot.
		"Revision": fmt.Sprint(st.Revision),
		"Keys":     fmt.Sprint(st.TotalKey),
		"Hash":     fmt.Sprintf("%08x", st.Hash),
	} {
		if fields[k] != want {
			t.Errorf("describe %s = %q, want %q\n%s", k, fields[k], want, r.out)
		}
	}
	if !strings.Contains(r.out, "Created:") || !strings.Contains(r.out, "ago)") {
		t.Errorf("describe lacks the creation time:\n%s", r.out)
	}
	// describe is no longer get's one-line table.
	if strings.HasPrefix(r.out, "NAME") {
		t.Errorf("describe prints a table:\n%s", r.out)
	}
	// An encrypted backup names its encryption and recipients, in
	// describe and in the document.
	key, other := agetest.NewKey(t), agetest.NewKey(t)
	snap, _, _ := writeSnapshot(t, "snap.db", smallSnapshot)
	mustRun(t, addr, "upload", snap, "--name", "enc", "--encrypt-to", key.Recipient, "--encrypt-to", other.Recipient)
	r = mustRun(t, addr, "describe", "enc")
	if !regexp.MustCompile(`(?m)^  Encryption:\s+age\n  Recipients:\s+` + key.Recipient + `\n\s+` + other.Recipient + `\n`).MatchString(r.out) {
		t.Errorf("describe enc:\n%s", r.out)
	}
	if r := mustRun(t, addr, "get", "enc", "-o", "jsonpath={.spec.encryption} {.spec.ageRecipients[0]}"); r.out != "age "+key.Recipient {
		t.Errorf("get enc -o jsonpath = %q", r.out)
	}

	r = mustFail(t, `backup "nope" not found`, addr, "describe", "nope")
	if ExitCode(r.err) != ExitNotFound {
		t.Errorf("describe nope: exit %d", ExitCode(r.err))
	}
}

func TestDeleteBySelectorAndAll(t *testing.T) {
	addr := startServer(t)
	file, _, _ := writeSnapshot(t, "x", smallSnapshot)
	for _, n := range []string{"t1", "t2"} {
		mustRun(t, addr, "upload", file, "--name", n, "--labels", "env=test")
	}
	mustRun(t, addr, "upload", file, "--name", "p1", "--labels", "env=prod")

	// Without a terminal, -l and --all need --yes; nothing is deleted.
	for _, args := range [][]string{{"delete", "-l", "env=test"}, {"delete", "--all"}} {
		r := runIn(t, "y\n", false, append([]string{addr}, args...)...)
		if r.err == nil || !strings.Contains(r.err.Error(), "needs --yes") || ExitCode(r.err) != ExitUsage {
			t.Fatalf("%v without a terminal: %v", args, r.err)
		}
	}
	if r := mustRun(t, addr, "list", "-o", "name"); strings.Count(r.out, "\n") != 3 {
		t.Fatalf("a refused delete deleted: %q", r.out)
	}
	// Flags that do not go together.
	for _, args := range [][]string{{"delete", "t1", "--all"}, {"delete", "-l", "a=b", "--all"}, {"delete"}} {
		if r := run(t, append([]string{addr}, args...)...); r.err == nil || ExitCode(r.err) != ExitUsage {
			t.Errorf("%v: %v, want a usage error", args, r.err)
		}
	}

	// On a terminal it asks; "n" keeps everything.
	r := runIn(t, "n\n", true, addr, "delete", "-l", "env=test")
	if r.err != nil || !strings.Contains(r.errOut, "about to delete 2 backup(s)") || !strings.Contains(r.errOut, "t1 (location default)") || !strings.Contains(r.errOut, "nothing deleted") {
		t.Fatalf("delete -l answered n: %v\n%s", r.err, r.errOut)
	}
	// "y" deletes what the selector matches, and only that.
	r = runIn(t, "y\n", true, addr, "delete", "-l", "env=test")
	if r.err != nil || r.out != "backup \"t2\" deleted\nbackup \"t1\" deleted\n" {
		t.Fatalf("delete -l answered y: %v\n%s%s", r.err, r.out, r.errOut)
	}
	if r := mustRun(t, addr, "list", "-o", "name"); r.out != "backup/p1\n" {
		t.Fatalf("after delete -l env=test: %q", r.out)
	}
	// --yes skips the question, terminal or not.
	r = runIn(t, "", true, addr, "delete", "--all", "--yes")
	if r.err != nil || r.out != "backup \"p1\" deleted\n" || strings.Contains(r.errOut, "about to delete") {
		t.Fatalf("delete --all --yes: %v\n%s%s", r.err, r.out, r.errOut)
	}
	r = mustRun(t, addr, "delete", "--all", "--yes")
	if r.errOut != "No backups found.\n" {
		t.Fatalf("delete --all of nothing: %q", r.errOut)
	}
	// Deleting by name without a terminal needs no --yes (as before).
	mustRun(t, addr, "upload", file, "--name", "n1")
	if r := runIn(t, "", false, addr, "delete", "n1"); r.err != nil {
		t.Fatalf("delete n1: %v", r.err)
	}
}

func TestExitCodes(t *testing.T) {
	addr := startServer(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"list", "--bogus"}, ExitUsage},
		{[]string{"nosuch"}, ExitUsage},
		{[]string{"get"}, ExitUsage},
		{[]string{"list", "-o", "xml"}, ExitUsage},
		{[]string{"backup", "--compression", "gzip"}, ExitUsage},
		{[]string{"restore", "b"}, ExitUsage},
		{[]string{"get", "Bad_Name"}, ExitUsage},
		{[]string{"get", "nope"}, ExitNotFound},
		{[]string{"download", "nope", "-o", "-"}, ExitNotFound},
		{[]string{"list", "--location", "elsewhere"}, ExitNotFound},
	} {
		r := run(t, append([]string{addr}, tc.args...)...)
		if got := ExitCode(r.err); got != tc.code {
			t.Errorf("%v: exit code %d (%v), want %d", tc.args, got, r.err, tc.code)
		}
	}
	if r := run(t, "--server-address", nowhere, "list"); ExitCode(r.err) != ExitError {
		t.Errorf("unreachable server: exit %d (%v), want %d", ExitCode(r.err), r.err, ExitError)
	}
	// Refusals, from the server or from the API server's RBAC.
	for _, err := range []error{
		withCode(codeExit(codes.PermissionDenied), errors.New("x")),
		withCode(codeExit(codes.Unauthenticated), errors.New("x")),
		fmt.Errorf("connect: %w", &tunnel.ForbiddenError{Err: errors.New("forbidden")}),
		status.Error(codes.PermissionDenied, "no"),
	} {
		if got := ExitCode(err); got != ExitRefused {
			t.Errorf("ExitCode(%v) = %d, want %d", err, got, ExitRefused)
		}
	}
	// The codes are in the root command's help.
	r := mustRun(t, "--help")
	for _, want := range []string{"Exit codes:", "2  usage error", "3  not found", "4  refused", "5  a backup or restore failed", "6  incomplete"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestCompletion(t *testing.T) {
	addr := startServer(t)
	file, _, _ := writeSnapshot(t, "x", smallSnapshot)
	for _, n := range []string{"alpha", "alps", "beta"} {
		mustRun(t, addr, "upload", file, "--name", n)
	}
	complete := func(args ...string) []string {
		t.Helper()
		r := mustRun(t, append([]string{addr, "__complete"}, args...)...)
		lines := strings.Split(strings.TrimSpace(r.out), "\n")
		return lines[:len(lines)-1] // the last line is cobra's directive
	}
	for _, cmd := range []string{"get", "describe", "download", "logs", "verify", "restore", "delete"} {
		if got := complete(cmd, "al"); strings.Join(got, ",") != "alpha,alps" {
			t.Errorf("%s al<TAB> = %v, want alpha, alps", cmd, got)
		}
	}
	// get takes one name; delete many, not twice the same.
	if got := complete("get", "alpha", ""); len(got) != 0 {
		t.Errorf("get alpha <TAB> = %v, want nothing", got)
	}
	if got := complete("delete", "alpha", "al"); strings.Join(got, ",") != "alps" {
		t.Errorf("delete alpha al<TAB> = %v, want alps", got)
	}
	if got := complete("list", "--location", ""); strings.Join(got, ",") != "default" {
		t.Errorf("--location <TAB> = %v", got)
	}
	if got := complete("list", "-o", ""); !contains(got, "jsonpath") || !contains(got, "custom-columns") || !contains(got, "wide") {
		t.Errorf("list -o <TAB> = %v", got)
	}
	// No server: nothing, and no error for the shell.
	r := mustRun(t, "--server-address", nowhere, "__complete", "get", "")
	if strings.TrimSpace(r.out) != ":4" {
		t.Errorf("completion without a server = %q", r.out)
	}
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if r := mustRun(t, "completion", shell); !strings.Contains(r.out, "kubectl-etcdbackup") {
			t.Errorf("completion %s does not complete kubectl-etcdbackup", shell)
		}
	}
}

func contains(s []string, want string) bool {
	for _, x := range s {
		if x == want {
			return true
		}
	}
	return false
}
