package plugin

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/dustin/go-humanize"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

func TestListAndGetTable(t *testing.T) {
	addr := startServer(t)
	r := mustRun(t, addr, "list")
	if r.out != "" || r.errOut != "No backups found.\n" {
		t.Fatalf("empty list: stdout %q, stderr %q; want only kubectl's %q on stderr", r.out, r.errOut, "No backups found.\n")
	}

	file, data, sum := writeSnapshot(t, "Snap.DB", bigSnapshot)
	size := uint64(len(data))
	st, err := snapshot.Check(file)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, addr, "upload", file, "--labels", "env=test,team=etcd")

	header, rows := parseTable(t, mustRun(t, addr, "list").out)
	if want := []string{"NAME", "LOCATION", "PHASE", "SIZE", "AGE", "VERIFIED"}; !reflect.DeepEqual(header, want) {
		t.Fatalf("list header %v, want %v", header, want)
	}
	if len(rows) != 1 {
		t.Fatalf("list has %d rows, want 1: %v", len(rows), rows)
	}
	row := rows[0]
	for col, want := range map[string]string{"NAME": "snap.db", "LOCATION": "default", "PHASE": "Completed", "SIZE": humanize.IBytes(size)} {
		if row[col] != want {
			t.Errorf("list %s = %q, want %q", col, row[col], want)
		}
	}
	if !strings.HasSuffix(row["AGE"], "s") {
		t.Errorf("list AGE = %q, want seconds", row["AGE"])
	}

	header, rows = parseTable(t, mustRun(t, addr, "list", "-o", "wide").out)
	if want := []string{"NAME", "LOCATION", "PHASE", "SIZE", "AGE", "VERIFIED", "SOURCE", "REVISION", "KEYS", "HASH", "COMPRESSION", "KIT", "LOCKED-UNTIL", "SHA256", "LABELS"}; !reflect.DeepEqual(header, want) {
		t.Fatalf("list -o wide header %v, want %v", header, want)
	}
	// upload records what it read from the snapshot: its revision, keys
	// and hash.
	for col, want := range map[string]string{"NAME": "snap.db", "SOURCE": "upload", "REVISION": fmt.Sprint(st.Revision), "KEYS": fmt.Sprint(st.TotalKey),
		"HASH": fmt.Sprintf("%08x", st.Hash), "COMPRESSION": "<none>", "KIT": "<none>", "LOCKED-UNTIL": "<none>", "SHA256": sum, "LABELS": "env=test,team=etcd"} {
		if rows[0][col] != want {
			t.Errorf("list -o wide %s = %q, want %q", col, rows[0][col], want)
		}
	}

	// get prints the same row as list.
	header, rows = parseTable(t, mustRun(t, addr, "get", "snap.db").out)
	if header[0] != "NAME" || len(rows) != 1 || rows[0]["NAME"] != "snap.db" || rows[0]["PHASE"] != "Completed" {
		t.Fatalf("get table: %v %v", header, rows)
	}

	// A label selector that matches nothing lists nothing.
	r = mustRun(t, addr, "list", "-l", "env=prod")
	if r.out != "" || r.errOut != "No backups found.\n" {
		t.Fatalf("list -l env=prod: stdout %q, stderr %q", r.out, r.errOut)
	}
}

// -o json and yaml are Kubernetes-style documents: phase as the table
// shows it, sizes as numbers, an empty list still a BackupList.
func TestListAndGetJSONAndYAML(t *testing.T) {
	addr := startServer(t)
	file, data, sum := writeSnapshot(t, "b1", smallSnapshot)
	mustRun(t, addr, "upload", file, "--labels", "env=test")

	var list BackupList
	out := mustRun(t, addr, "list", "-o", "json").out
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("list -o json: %v\n%s", err, out)
	}
	if list.APIVersion != "etcdbackup.io/v1" || list.Kind != "BackupList" || len(list.Items) != 1 {
		t.Fatalf("list -o json: apiVersion %q kind %q, %d items; want etcdbackup.io/v1 BackupList with 1\n%s", list.APIVersion, list.Kind, len(list.Items), out)
	}
	b := list.Items[0]
	if b.Kind != "Backup" || b.Metadata.Name != "b1" || b.Status.SHA256 != sum || b.Status.SizeBytes != int64(len(data)) ||
		b.Metadata.Labels["env"] != "test" || b.Status.Phase != "Completed" || b.Spec.Location != "default" ||
		b.Spec.Source == nil || b.Spec.Source.Kind != "upload" || b.Metadata.CreationTimestamp == nil {
		t.Fatalf("list -o json item: %+v", b)
	}
	// Sizes are JSON numbers, the phase is the table's word.
	for _, want := range []string{fmt.Sprintf(`"sizeBytes": %d`, len(data)), `"phase": "Completed"`, `"kind": "BackupList"`} {
		if !strings.Contains(out, want) {
			t.Errorf("list -o json lacks %s:\n%s", want, out)
		}
	}

	// An empty list is still a document, not the table's notice.
	r := mustRun(t, addr, "list", "-o", "json", "-l", "env=none")
	var empty map[string]any
	if err := json.Unmarshal([]byte(r.out), &empty); err != nil || r.errOut != "" {
		t.Fatalf("empty list -o json: %v; stdout %q, stderr %q", err, r.out, r.errOut)
	}
	if want := map[string]any{"apiVersion": "etcdbackup.io/v1", "kind": "BackupList", "items": []any{}}; !reflect.DeepEqual(empty, want) {
		t.Fatalf("empty list -o json = %v, want %v", empty, want)
	}

	y := mustRun(t, addr, "get", "b1", "-o", "yaml").out
	if !strings.Contains(y, "sha256: "+sum+"\n") || !strings.HasPrefix(y, "apiVersion: etcdbackup.io/v1\nkind: Backup\n") {
		t.Fatalf("get -o yaml is not a Backup document with the sha256 line: %s", y)
	}
	var got Backup
	if err := yaml.Unmarshal([]byte(y), &got); err != nil {
		t.Fatalf("get -o yaml is not YAML: %v\n%s", err, y)
	}
	if got.Metadata.Name != "b1" || got.Status.SHA256 != sum || got.Status.SizeBytes != int64(len(data)) || got.Spec.Compression != "none" || got.Spec.Encryption != "none" {
		t.Fatalf("get -o yaml: %+v", got)
	}
	if err := json.Unmarshal([]byte(mustRun(t, addr, "get", "b1", "-o", "json").out), &got); err != nil || got.Status.SHA256 != sum || got.Kind != "Backup" {
		t.Fatalf("get -o json: %v %+v", err, got)
	}
}

func TestGetMissingBackup(t *testing.T) {
	addr := startServer(t)
	r := mustFail(t, `get backup "nope"`, addr, "get", "nope")
	for _, want := range []string{`backup "nope" not found`, "kubectl etcdbackup list"} {
		if !strings.Contains(r.err.Error(), want) {
			t.Errorf("error %q does not contain %q", r.err, want)
		}
	}
	if r.out != "" {
		t.Errorf("get of a missing backup printed %q", r.out)
	}
	mustFail(t, `storage location "elsewhere" does not exist`, addr, "list", "--location", "elsewhere")
}

const (
	machineAllowed = "json, yaml, kyaml, name, go-template, go-template-file, template, templatefile, jsonpath, jsonpath-as-json, jsonpath-file"
	tableAllowed   = "table, wide, " + machineAllowed + ", custom-columns"
	plainAllowed   = "table, " + machineAllowed
)

// -o is refused before the server is contacted, with the flag and every
// value the command accepts, and those values are the ones its help names.
func TestOutputFormatFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		allowed string
		// next is the error a valid -o runs into: the step after Validate.
		next string
	}{
		{[]string{"list"}, tableAllowed, "cannot reach the etcdbackup server at " + nowhere},
		{[]string{"get", "b"}, tableAllowed, "cannot reach the etcdbackup server at " + nowhere},
		{[]string{"backup"}, tableAllowed, "cannot reach the etcdbackup server at " + nowhere},
		{[]string{"upload", "/does/not/exist.db"}, tableAllowed, "open /does/not/exist.db: no such file or directory"},
		{[]string{"version"}, plainAllowed, "cannot reach the etcdbackup server at " + nowhere},
		{[]string{"verify", "b"}, plainAllowed, "cannot reach the etcdbackup server at " + nowhere},
		{[]string{"restore", "b", "--target", "t"}, plainAllowed, "cannot reach the etcdbackup server at " + nowhere},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			args := append([]string{"--server-address", nowhere}, tc.args...)
			r := run(t, append(args, "-o", "bogus")...)
			want := fmt.Sprintf("-o %q is not a known output format; use one of %s", "bogus", tc.allowed)
			if r.err == nil || r.err.Error() != want {
				t.Fatalf("-o bogus: error %v, want %q", r.err, want)
			}
			// The help lists the same formats.
			cmd, _, err := NewCmdRoot(genericiooptionsForHelp()).Find(tc.args[:1])
			if err != nil {
				t.Fatal(err)
			}
			usage := cmd.Flags().Lookup("output").Usage
			if got := strings.ReplaceAll(usage[strings.Index(usage, ": ")+2:], " or ", ", "); got != tc.allowed {
				t.Errorf("-o help %q lists %q, validation accepts %q", usage, got, tc.allowed)
			}
			// Each allowed format gets past Validate to the next step.
			for _, f := range strings.Split(tc.allowed, ", ") {
				switch f {
				case "jsonpath", "jsonpath-as-json", "go-template", "template":
					f += "={.metadata.name}"
				case "custom-columns":
					f += "=NAME:.metadata.name"
				case "jsonpath-file", "go-template-file", "templatefile":
					continue // need a file; the parsing is cli-runtime's
				}
				r := run(t, append(args, "-o", f)...)
				if r.err == nil || !strings.Contains(r.err.Error(), tc.next) {
					t.Errorf("-o %s: %v, want it accepted and then %q", f, r.err, tc.next)
				}
			}
		})
	}
}

func TestVersion(t *testing.T) {
	// --client never contacts the server.
	r := mustRun(t, "--server-address", nowhere, "version", "--client")
	if want := "Client Version: " + version.Version + "\n"; r.out != want {
		t.Fatalf("version --client = %q, want %q", r.out, want)
	}
	var v struct {
		ClientVersion struct{ Version string } `json:"clientVersion"`
		Server        *struct{}                `json:"server"`
	}
	if err := yaml.Unmarshal([]byte(mustRun(t, "--server-address", nowhere, "version", "--client", "-o", "yaml").out), &v); err != nil {
		t.Fatal(err)
	}
	if v.ClientVersion.Version != version.Version || v.Server != nil {
		t.Fatalf("version --client -o yaml: %+v", v)
	}

	addr := startServer(t)
	r = mustRun(t, addr, "version")
	want := "Client Version: " + version.Version + "\nServer Version: " + version.Version + "\nStorage Location: default (default), filesystem: "
	if !strings.HasPrefix(r.out, want) {
		t.Fatalf("version = %q, want it to start with %q", r.out, want)
	}
	var full struct {
		ClientVersion struct{ Version string } `json:"clientVersion"`
		Server        struct {
			Version   string
			Locations []struct {
				Name, Type string
				Default    bool
			}
		} `json:"server"`
	}
	if err := yaml.Unmarshal([]byte(mustRun(t, addr, "version", "-o", "json").out), &full); err != nil {
		t.Fatal(err)
	}
	if full.Server.Version != version.Version || len(full.Server.Locations) != 1 || full.Server.Locations[0].Name != "default" || !full.Server.Locations[0].Default {
		t.Fatalf("version -o json: %+v", full)
	}
}

func TestArgumentAndFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"get", "b", "-z"}, "unknown shorthand flag: 'z' in -z"},
		{[]string{"get"}, "accepts 1 arg(s), received 0"},
		{[]string{"list", "extra"}, `unknown command "extra" for "kubectl etcdbackup list"`},
		{[]string{"delete"}, "say what to delete: backup names, -l SELECTOR or --all"},
		{[]string{"download", "a", "b"}, "accepts 1 arg(s), received 2"},
		{[]string{"backup", "--compression", "gzip"}, `--compression "gzip" is not supported; use zstd or none`},
		{[]string{"backup", "--timeout", "soon"}, `invalid argument "soon" for "--timeout" flag`},
		{[]string{"upload", "x.db", "--name", "Bad_Name"}, `backup name "Bad_Name" is invalid`},
		{[]string{"nosuch"}, `unknown command "nosuch" for "kubectl etcdbackup"`},
	} {
		r := run(t, append([]string{"--server-address", nowhere}, tc.args...)...)
		if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to contain %q", tc.args, r.err, tc.want)
		}
	}
}

// Every example has kubectl's "# what it does" line above it.
func TestExamplesAreCommented(t *testing.T) {
	root := NewCmdRoot(genericiooptionsForHelp())
	for _, cmd := range root.Commands() {
		if cmd.Name() == "help" || cmd.Name() == "completion" {
			continue
		}
		if cmd.Example == "" {
			t.Errorf("%s has no examples", cmd.Name())
			continue
		}
		lines := strings.Split(cmd.Example, "\n")
		for i, l := range lines {
			if !strings.HasPrefix(l, "  kubectl etcdbackup ") {
				continue
			}
			if i == 0 || !strings.HasPrefix(lines[i-1], "  # ") {
				t.Errorf("%s: example %q has no # comment above it", cmd.Name(), l)
			}
			if !strings.HasPrefix(l, "  kubectl etcdbackup "+cmd.Name()) {
				t.Errorf("%s: example %q runs another command", cmd.Name(), l)
			}
		}
	}
}
