package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot/kube/kubetest"
)

var (
	fixtureOnce sync.Once
	fixture     *kubetest.Fixture
	fixtureData []byte
)

// kubeFixture is the snapshot of kubetest's fixture (written once per
// test binary), copied into the test's own directory.
func kubeFixture(t *testing.T) (*kubetest.Fixture, string) {
	t.Helper()
	fixtureOnce.Do(func() {
		fixture = kubetest.WriteFixture(t)
		var err error
		if fixtureData, err = os.ReadFile(fixture.Path); err != nil {
			t.Fatal(err)
		}
	})
	if fixtureData == nil {
		t.Fatal("the fixture could not be written")
	}
	path := filepath.Join(t.TempDir(), "fixture.db")
	if err := os.WriteFile(path, fixtureData, 0o600); err != nil {
		t.Fatal(err)
	}
	return fixture, path
}

func contentsOf(t *testing.T, out string) BackupContents {
	t.Helper()
	var c BackupContents
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return c
}

// A snapshot on disk, no server: the table counts each resource, the
// wide table each resource per namespace, and -o json is the document
// with etcd's own revision and key count.
func TestInspectFromFile(t *testing.T) {
	_, path := kubeFixture(t)
	st, err := snapshot.Check(path)
	if err != nil {
		t.Fatal(err)
	}
	r := mustRun(t, "inspect", "fx", "--from-file", path)
	header, rows := parseTable(t, r.out)
	if want := []string{"RESOURCE", "OBJECTS", "SIZE", "ENCRYPTED", "NAMESPACES"}; !reflect.DeepEqual(header, want) {
		t.Fatalf("header %v\n%s", header, r.out)
	}
	byName := map[string]map[string]string{}
	var order []string
	for _, row := range rows {
		byName[row["RESOURCE"]] = row
		order = append(order, row["RESOURCE"])
	}
	for name, want := range map[string][3]string{
		"configmaps": {"4", "0", "2"}, "secrets": {"3", "2", "2"}, "widgets.example.com": {"2", "0", "2"},
		"gadgets.example.com": {"1", "0", "<none>"}, "deployments.apps": {"1", "0", "1"}, "namespaces": {"2", "0", "<none>"},
		"/registry/masterleases/": {"1", "0", "<none>"}, "apiservices.apiregistration.k8s.io": {"1", "0", "<none>"},
	} {
		row := byName[name]
		if got := [3]string{row["OBJECTS"], row["ENCRYPTED"], row["NAMESPACES"]}; got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if order[len(order)-1] != "/registry/ranges/" {
		t.Errorf("kube-apiserver's own records are not last: %v", order)
	}
	if !strings.Contains(r.errOut, fmt.Sprintf("etcd revision %d, %d keys;", st.Revision, st.TotalKey)) ||
		!strings.Contains(r.errOut, fmt.Sprintf("%d objects under /registry/", kubetest.FixtureObjects)) || !strings.Contains(r.errOut, "1 key outside it") {
		t.Errorf("summary: %s", r.errOut)
	}

	r = mustRun(t, "inspect", "fx", "--from-file", path, "-o", "wide")
	_, rows = parseTable(t, r.out)
	var wide []string
	for _, row := range rows {
		wide = append(wide, row["NAMESPACE"]+" "+row["RESOURCE"]+" "+row["OBJECTS"]+" "+row["ENCRYPTED"])
	}
	for _, want := range []string{"app configmaps 3 0", "other configmaps 1 0", "app secrets 2 1", "other secrets 1 1", "<none> namespaces 2 0", "other widgets.example.com 1 0"} {
		if !strings.Contains(strings.Join(wide, "\n")+"\n", want+"\n") {
			t.Errorf("-o wide lacks %q:\n%s", want, r.out)
		}
	}
	if !strings.HasPrefix(wide[0], "<none> ") || !strings.HasPrefix(wide[len(wide)-1], "other ") {
		t.Errorf("-o wide is not by namespace:\n%s", r.out)
	}

	c := contentsOf(t, mustRun(t, "inspect", "fx", "--from-file", path, "-o", "json").out)
	if c.Kind != "BackupContents" || c.APIVersion != "etcdbackup.io/v1" || c.Metadata.Name != "fx" || c.Spec.File != path || c.Spec.EtcdPrefix != "/registry/" {
		t.Errorf("document %+v", c)
	}
	if c.Status.Revision != st.Revision || c.Status.TotalKeys != int64(st.TotalKey) || c.Status.Objects != kubetest.FixtureObjects || c.Status.Encrypted != kubetest.FixtureEncrypted || c.Status.OtherKeys != 1 {
		t.Errorf("status %+v", c.Status)
	}
	for _, res := range c.Status.Resources {
		if res.Resource == "widgets" && (!res.Custom || !res.Namespaced || res.Kind != "Widget" || res.EtcdPath != "/registry/example.com/widgets/" || len(res.Namespaces) != 2) {
			t.Errorf("widgets %+v", res)
		}
	}

	// Another prefix: nothing of Kubernetes, said so.
	r = mustRun(t, "inspect", "fx", "--from-file", path, "--etcd-prefix", "/kubernetes.io")
	if r.out != "" || !strings.Contains(r.errOut, "no Kubernetes objects under /kubernetes.io/") || !strings.Contains(r.errOut, "No Kubernetes objects found") {
		t.Errorf("--etcd-prefix /kubernetes.io:\n%s\n%s", r.out, r.errOut)
	}
	// Not a snapshot.
	junk, _, _ := writeRandom(t, "junk.db", 4096+32)
	mustFail(t, "not a usable etcd snapshot", "inspect", "fx", "--from-file", junk)
	mustFail(t, "does not go with --storage-config or --server-address", "inspect", "fx", "--from-file", path, "--server-address", nowhere)
}

// Through the server the backup is downloaded and checked as download
// does, and reads the same as the file; an encrypted one needs
// --identity; with --storage-config the location is read without the
// server, to the same document.
func TestInspectOnlineAndStorageConfig(t *testing.T) {
	_, path := kubeFixture(t)
	srv := servertest.Start(t, "")
	addr := "--server-address=" + srv.Addr
	key := agetest.NewKey(t)
	mustRun(t, addr, "upload", path, "--name", "plain")
	mustRun(t, addr, "upload", path, "--name", "sealed", "--encrypt-to", key.Recipient)

	want := contentsOf(t, mustRun(t, "inspect", "fx", "--from-file", path, "-o", "json").out).Status
	online := mustRun(t, addr, "inspect", "plain", "-o", "json")
	if got := contentsOf(t, online.out); !reflect.DeepEqual(got.Status, want) || got.Spec.Location != "default" || got.Spec.File != "" {
		t.Errorf("online %+v\nwant %+v", got, want)
	}
	mustFail(t, "--identity", addr, "inspect", "sealed")
	if got := contentsOf(t, mustRun(t, addr, "inspect", "sealed", "-o", "json", "--identity", key.File).out); !reflect.DeepEqual(got.Status, want) {
		t.Errorf("encrypted: %+v", got.Status)
	}
	r := run(t, addr, "inspect", "nosuch")
	if ExitCode(r.err) != ExitNotFound {
		t.Errorf("inspect of a missing backup: exit %d: %v", ExitCode(r.err), r.err)
	}

	// A zstd-compressed file (download --raw of a compressed backup).
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	rc, err := snapshot.Compress(context.Background(), in, "zstd")
	if err != nil {
		t.Fatal(err)
	}
	zst := filepath.Join(t.TempDir(), "fixture.db.zst")
	b, _ := io.ReadAll(rc)
	os.WriteFile(zst, b, 0o600)
	if got := contentsOf(t, mustRun(t, "inspect", "fx", "--from-file", zst, "-o", "json").out); !reflect.DeepEqual(got.Status, want) {
		t.Errorf("from a zstd file: %+v", got.Status)
	}

	srv.Stop()
	useBreakGlass(t)
	cfg := writeConfig(t, fmt.Sprintf("locations:\n  - name: default\n    filesystem: {path: %s}\n", srv.Dir))
	if got := contentsOf(t, mustRun(t, "inspect", "plain", "--storage-config", cfg, "-o", "json").out); !reflect.DeepEqual(got.Status, want) {
		t.Errorf("--storage-config: %+v", got.Status)
	}
	mustFail(t, "does not go with --storage-config or --server-address", "inspect", "plain", "--storage-config", cfg, "--from-file", path)
}
