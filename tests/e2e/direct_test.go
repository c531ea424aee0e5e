package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The plugin binary against the server binary over --server-address.
func TestPluginDirect(t *testing.T) {
	srv := startServer(t)
	addr := "--server-address=" + srv.Addr
	dir := t.TempDir()
	src := filepath.Join(dir, "Snapshot.DB")
	data := writeSnapshotFile(t, src, 3<<20+17)

	r := mustSucceed(t, plugin(t, addr, "upload", src, "--labels", "env=test"), "upload")
	if !strings.Contains(r.Stdout, `"snapshot.db" uploaded`) || !strings.Contains(r.Stdout, sha(data)) {
		t.Fatalf("upload output lacks name or sha: %s", r)
	}
	mustFail(t, plugin(t, addr, "upload", src), "second upload of the same name")

	r = mustSucceed(t, plugin(t, addr, "list"), "list")
	if !strings.Contains(r.Stdout, "snapshot.db") || !strings.Contains(r.Stdout, "Completed") || !strings.HasPrefix(r.Stdout, "NAME") {
		t.Fatalf("list table: %s", r)
	}
	r = mustSucceed(t, plugin(t, addr, "list", "-o", "json"), "list -o json")
	// A Kubernetes-style BackupList (docs/scripting.md): sizes are numbers.
	var list struct {
		APIVersion, Kind string
		Items            []struct {
			Metadata struct {
				Name   string
				Labels map[string]string
			}
			Status struct {
				Phase, Sha256 string
				SizeBytes     int64
			}
		}
	}
	if err := json.Unmarshal([]byte(r.Stdout), &list); err != nil {
		t.Fatalf("list -o json is not JSON: %v\n%s", err, r.Stdout)
	}
	if list.APIVersion != "etcdbackup.io/v1" || list.Kind != "BackupList" || len(list.Items) != 1 ||
		list.Items[0].Status.Sha256 != sha(data) || list.Items[0].Status.SizeBytes != int64(len(data)) ||
		list.Items[0].Status.Phase != "Completed" || list.Items[0].Metadata.Labels["env"] != "test" {
		t.Fatalf("list -o json: %+v", list)
	}
	r = mustSucceed(t, plugin(t, addr, "get", "snapshot.db", "-o", "yaml"), "get -o yaml")
	if !strings.Contains(r.Stdout, "sha256: "+sha(data)) {
		t.Fatalf("get -o yaml: %s", r)
	}
	mustSucceed(t, plugin(t, addr, "list", "-o", "wide"), "list -o wide")

	out := filepath.Join(dir, "out.db")
	mustSucceed(t, plugin(t, addr, "download", "snapshot.db", "-o", out, "--raw"), "download")
	mustEqualFile(t, out, data)
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Fatalf(".part left behind: %v", err)
	}
	r = mustFail(t, plugin(t, addr, "download", "snapshot.db", "-o", out), "download over an existing file")
	if !strings.Contains(r.Stderr, "--overwrite") {
		t.Fatalf("error does not say how to overwrite: %s", r)
	}
	mustSucceed(t, plugin(t, addr, "download", "snapshot.db", "-o", out, "--overwrite", "--raw"), "download --overwrite")
	mustEqualFile(t, out, data)

	r = mustSucceed(t, plugin(t, addr, "download", "snapshot.db", "-o", "-", "--raw"), "download -o -")
	if r.Stdout != string(data) {
		t.Fatalf("download -o - wrote %d bytes, want %d", len(r.Stdout), len(data))
	}

	r = mustSucceed(t, plugin(t, addr, "version"), "version")
	if !strings.Contains(r.Stdout, "Client Version:") || !strings.Contains(r.Stdout, "Server Version:") || !strings.Contains(r.Stdout, "default (default), filesystem") {
		t.Fatalf("version: %s", r)
	}

	mustSucceed(t, plugin(t, addr, "delete", "snapshot.db"), "delete")
	r = mustFail(t, plugin(t, addr, "get", "snapshot.db"), "get after delete")
	if !strings.Contains(r.Stderr, "not found") || !strings.Contains(r.Stderr, "kubectl etcdbackup list") {
		t.Fatalf("not-found error does not help: %s", r)
	}
	r = mustSucceed(t, plugin(t, addr, "list"), "list after delete")
	if strings.Contains(r.Stdout, "snapshot.db") {
		t.Fatalf("deleted backup still listed: %s", r)
	}
}

// An interrupted download leaves FILE.part; the next run resumes from it
// and the result is byte-identical. A .part that does not match the backup
// is detected by the final SHA-256 and removed.
func TestPluginDownloadResumesFromPart(t *testing.T) {
	srv := startServer(t)
	addr := "--server-address=" + srv.Addr
	dir := t.TempDir()
	data := writeSnapshotFile(t, filepath.Join(dir, "src"), 6<<20+5)
	mustSucceed(t, plugin(t, addr, "upload", filepath.Join(dir, "src"), "--name", "b1"), "upload")

	out := filepath.Join(dir, "b1.db")
	half := len(data) / 2
	if err := os.WriteFile(out+".part", data[:half], 0o600); err != nil {
		t.Fatal(err)
	}
	r := mustSucceed(t, plugin(t, addr, "download", "b1", "-o", out, "--raw"), "resumed download")
	if !strings.Contains(r.Stderr, "resuming") {
		t.Fatalf("did not resume: %s", r)
	}
	mustEqualFile(t, out, data)
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Fatalf(".part left behind: %v", err)
	}

	// A .part with wrong bytes: refused, removed, and a rerun succeeds.
	bad := append([]byte(nil), data[:half]...)
	bad[100] ^= 0xff
	other := filepath.Join(dir, "other.db")
	if err := os.WriteFile(other+".part", bad, 0o600); err != nil {
		t.Fatal(err)
	}
	r = mustFail(t, plugin(t, addr, "download", "b1", "-o", other, "--raw"), "download resuming from a corrupt .part")
	if !strings.Contains(r.Stderr, "SHA-256") || !strings.Contains(r.Stderr, "run the download again") {
		t.Fatalf("corrupt .part error does not explain: %s", r)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Fatal("a corrupt download was renamed into place")
	}
	if _, err := os.Stat(other + ".part"); !os.IsNotExist(err) {
		t.Fatal("corrupt .part was kept")
	}
	mustSucceed(t, plugin(t, addr, "download", "b1", "-o", other, "--raw"), "download after removing the corrupt .part")
	mustEqualFile(t, other, data)

	// A .part larger than the backup is not of this backup.
	if err := os.WriteFile(other+"2.part", append(data, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	r = mustFail(t, plugin(t, addr, "download", "b1", "-o", other+"2", "--raw"), "download with oversized .part")
	if !strings.Contains(r.Stderr, "past the end") {
		t.Fatalf("oversized .part error: %s", r)
	}
}

// Bad input is refused with a message naming the flag or value, and
// nothing is changed.
func TestPluginBadInput(t *testing.T) {
	srv := startServer(t)
	addr := "--server-address=" + srv.Addr
	dir := t.TempDir()
	src := filepath.Join(dir, "snap.db")
	writeSnapshotFile(t, src, 1000)
	junk := filepath.Join(dir, "junk.db")
	writeJunkFile(t, junk, 4096)

	cases := []struct {
		args []string
		want string
	}{
		{[]string{"list", "-o", "xml"}, `-o "xml" is not a known output format`},
		{[]string{"upload", src, "--name", "Bad_Name"}, "--name"},
		{[]string{"upload", filepath.Join(dir, "missing.db")}, "no such file"},
		{[]string{"upload", dir, "--name", "d"}, "is a directory"},
		{[]string{"upload", junk}, junk + " is not an etcd snapshot"},
		{[]string{"get", "../etc/passwd"}, "invalid"},
		{[]string{"download", "nope", "-o", filepath.Join(dir, "x")}, "not found"},
		{[]string{"list", "--location", "elsewhere"}, `storage location "elsewhere" does not exist`},
		{[]string{"get"}, "accepts 1 arg"},
	}
	for _, c := range cases {
		r := mustFail(t, plugin(t, append([]string{addr}, c.args...)...), strings.Join(c.args, " "))
		if !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%v: stderr does not contain %q: %s", c.args, c.want, r)
		}
	}
	r := mustSucceed(t, plugin(t, addr, "list", "-o", "json"), "list")
	if strings.Contains(r.Stdout, "name") {
		t.Fatalf("bad input stored something: %s", r.Stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.part")); !os.IsNotExist(err) {
		t.Fatal("a failed download left a .part")
	}

	// Nothing listens there.
	free := "127.0.0.1:1"
	r = mustFail(t, plugin(t, "--server-address="+free, "list"), "list against nothing")
	if !strings.Contains(r.Stderr, "cannot reach the etcdbackup server at "+free) {
		t.Fatalf("unreachable error: %s", r)
	}
}
