package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// The agent reads the inputs exactly as the server writes them into the
// fold Job's annotation, and refuses a file that is not them.
func TestFoldReadsTheServersInputs(t *testing.T) {
	in := jobs.FoldInputs{Full: jobs.FoldRef{Name: "cp-full", SHA256: strings.Repeat("a", 64)},
		Segments: []jobs.FoldRef{{Name: "cp-full.delta-11", SHA256: strings.Repeat("b", 64)}}, ToRevision: 20}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "inputs.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readInputs(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Full.Name != "cp-full" || got.Full.SHA256 != in.Full.SHA256 || len(got.Segments) != 1 ||
		got.Segments[0].Name != "cp-full.delta-11" || got.Segments[0].SHA256 != in.Segments[0].SHA256 || got.ToRevision != 20 {
		t.Fatalf("read %+v from %s", got, b)
	}
	for name, bad := range map[string]string{
		"unknown field": `{"full":{"name":"f","sha256":"x"},"segments":[{"name":"s","sha256":"y"}],"toRevision":3,"extra":1}`,
		"no segments":   `{"full":{"name":"f","sha256":"x"},"segments":[],"toRevision":3}`,
		"too long":      `{"full":{"name":"` + strings.Repeat("f", maxInputsBytes) + `"}}`,
	} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readInputs(path); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
