package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// FuzzLoad: Load never panics on any file; what it accepts passes
// Validate, and written back out it loads again to the same thing — a
// configuration the server starts with means one thing.
func FuzzLoad(f *testing.F) {
	for _, seed := range configSeeds(f) {
		f.Add([]byte(seed))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		if err != nil {
			if c != nil {
				t.Fatalf("Load returned a config with its error %v", err)
			}
			return
		}
		if errs := Validate(c); len(errs) > 0 {
			t.Fatalf("Load accepted a config that Validate refuses: %v", errs.ToAggregate())
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("an accepted config does not encode: %v", err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		again, err := Load(path)
		if err != nil {
			t.Fatalf("an accepted config, written back, is refused: %v\n%s", err, out)
		}
		out2, err := yaml.Marshal(again)
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("an accepted config changes when written back (%v):\n%s\n---\n%s", err, out, out2)
		}
	})
}

// configSeeds are the configurations the project ships or documents —
// the package example, the ConfigMap in manifests/server.yaml — and a few
// refused ones.
func configSeeds(f *testing.F) []string {
	f.Helper()
	src, err := os.ReadFile("config.go")
	if err != nil {
		f.Fatal(err)
	}
	var example strings.Builder
	for line := range strings.SplitSeq(string(src), "\n") {
		if y, ok := strings.CutPrefix(line, "//\t"); ok {
			example.WriteString(y + "\n")
		}
	}
	seeds := []string{example.String()}
	b, err := os.ReadFile("../../manifests/server.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		var cm struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if yaml.Unmarshal([]byte(doc), &cm) == nil && cm.Kind == "ConfigMap" && cm.Data["config.yaml"] != "" {
			seeds = append(seeds, cm.Data["config.yaml"])
		}
	}
	if len(seeds) < 2 {
		f.Fatal("no config.yaml in manifests/server.yaml")
	}
	return append(seeds,
		head+"      - name: m0\n        peerURL: http://m0:2380\n        volume: {persistentVolumeClaim: {claimName: c}}\nagents:\n  ttlAfterFinished: 90s\n  deadline: 2h\n",
		head+"      - name: m0\n        peerURL: http://m0:2380\n        nodeName: cp-1\n        volume: {hostPath: {path: /var/lib}}\n    restoreRunAsUser: 0\n",
		"locations: []\n",
		"locations:\n  - name: Bad_Name\n    filesystem: {path: relative}\n",
		"locations:\n  - name: default\n    filesystem: {path: /x}\n    s3: {bucket: b}\n",
		"agents: {deadline: -1s}\n",
		"{",
		"",
	)
}
