package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func load(t *testing.T, s string) (*File, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(p)
}

const head = `locations:
  - name: default
    filesystem: {path: /tmp/x}
targets:
  - name: app
    endpoints: [http://etcd-0.app.svc:2379]
    namespace: app
    initialClusterToken: tok
    members:
`

func TestTargetMembers(t *testing.T) {
	f, err := load(t, head+`      - name: etcd-0
        peerURL: http://etcd-0.app.svc:2380
        clientURL: http://etcd-0.app.svc:2379
        dataDir: data
        volume: {persistentVolumeClaim: {claimName: data-etcd-0}}
      - name: cp-1
        peerURL: https://10.0.0.10:2380
        volume: {hostPath: {path: /var/lib}}
        dataDir: etcd
        nodeName: cp-1
`)
	if err != nil {
		t.Fatal(err)
	}
	ts := f.ServerTargets()
	m := ts[0].Members
	if ts[0].Namespace != "app" || ts[0].InitialClusterToken != "tok" || len(m) != 2 ||
		m[0].ClaimName != "data-etcd-0" || m[0].DataDir != "data" || m[1].HostPath != "/var/lib" || m[1].NodeName != "cp-1" {
		t.Fatalf("targets: %+v", ts)
	}
}

func TestTargetMemberErrors(t *testing.T) {
	for what, member := range map[string]string{
		"unknown key":  "      - name: a\n        peerURL: http://a:2380\n        volume: {persistentVolumeClaim: {claimName: c}}\n        dataDirectory: x\n",
		"no volume":    "      - name: a\n        peerURL: http://a:2380\n",
		"two volumes":  "      - name: a\n        peerURL: http://a:2380\n        volume: {persistentVolumeClaim: {claimName: c}, hostPath: {path: /x}}\n        nodeName: n\n",
		"no node":      "      - name: a\n        peerURL: http://a:2380\n        volume: {hostPath: {path: /x}}\n",
		"no claimName": "      - name: a\n        peerURL: http://a:2380\n        volume: {persistentVolumeClaim: {}}\n",
	} {
		if _, err := load(t, head+member); err == nil {
			t.Errorf("%s: accepted", what)
		} else if what == "unknown key" && !strings.Contains(err.Error(), "dataDirectory") {
			t.Errorf("unknown key: %v", err)
		}
	}
}
