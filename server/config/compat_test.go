package config

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestShippedManifestLoads loads the config.yaml of the ConfigMap in
// manifests/server.yaml: what a user applies must start.
func TestShippedManifestLoads(t *testing.T) {
	b, err := os.ReadFile("../../manifests/server.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		var cm struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			t.Fatal(err)
		}
		c, ok := cm.Data["config.yaml"]
		if cm.Kind != "ConfigMap" || !ok {
			continue
		}
		found = true
		f, err := load(t, c)
		if err != nil {
			t.Fatalf("%v\n%s", err, c)
		}
		// The agent image is the Deployment's init container, which
		// kustomize's images: rewrites (server/jobs checks it); an image
		// here would override it and escape the overlay's renaming.
		if f.Locations[0].Name != "default" || f.Agents.Image != "" || f.Agents.ServiceAccount != "etcdbackup-agent" {
			t.Errorf("loaded %+v", f)
		}
	}
	if !found {
		t.Fatal("no ConfigMap with config.yaml in manifests/server.yaml")
	}
}

// TestKubeadmExampleLoads loads the configuration of the example overlay
// manifests/examples/kubeadm (docs/install.md) as shipped, placeholders and
// all: a user who only fills in addresses must get a server that starts.
func TestKubeadmExampleLoads(t *testing.T) {
	b, err := os.ReadFile("../../manifests/examples/kubeadm/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	f, err := load(t, cm.Data["config.yaml"])
	if err != nil {
		t.Fatalf("%v\n%s", err, cm.Data["config.yaml"])
	}
	if len(f.Targets) != 1 || f.Targets[0].Name != "control-plane" || len(f.Targets[0].Members) != 3 || f.Locations[0].S3 == nil {
		t.Errorf("loaded %+v", f)
	}
	for _, m := range f.Targets[0].Members {
		if m.Volume.HostPath == nil || m.Volume.HostPath.Path+"/"+m.DataDir != "/var/lib/etcd" || m.NodeName == "" {
			t.Errorf("member %s: want kubeadm's /var/lib/etcd on a named node, got %+v", m.Name, m)
		}
	}
	// The schedule and retention it suggests, commented out, load too.
	config := cm.Data["config.yaml"]
	for _, key := range []string{"schedule:", "timeZone:", "retention:"} {
		config = strings.Replace(config, "# "+key, key, 1)
	}
	f, err = load(t, config)
	if err != nil {
		t.Fatalf("with its schedule and retention: %v", err)
	}
	if r := f.Targets[0].Retention; f.Targets[0].Schedule != "@hourly" || r == nil || r.KeepMonthly != 12 {
		t.Errorf("with its schedule and retention: %+v", f.Targets[0])
	}
}

// TestHAComponentLoads loads the configuration of the component
// manifests/components/ha, whose replicas must be its Deployment's.
func TestHAComponentLoads(t *testing.T) {
	b, err := os.ReadFile("../../manifests/components/ha/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	f, err := load(t, cm.Data["config.yaml"])
	if err != nil {
		t.Fatalf("%v\n%s", err, cm.Data["config.yaml"])
	}
	if b, err = os.ReadFile("../../manifests/components/ha/deployment.yaml"); err != nil {
		t.Fatal(err)
	}
	var d struct {
		Spec struct {
			Replicas int `json:"replicas"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if f.Replicas < 2 || f.Replicas != d.Spec.Replicas {
		t.Errorf("config.yaml has replicas %d, the Deployment %d: want the same, above 1", f.Replicas, d.Spec.Replicas)
	}
}

// TestSandboxFormatLoads is the file tests/world writes for the sandbox
// (with an in-cluster restore target as tests/e2e configures it): the
// model must keep accepting every key it uses.
func TestSandboxFormatLoads(t *testing.T) {
	f, err := load(t, `locations:
  - name: default
    filesystem:
      path: /var/lib/etcdbackup
  - name: s3
    s3:
      bucket: etcdbackup
      prefix: sandbox
      region: us-east-1
      endpoint: https://s3.etcdbackup-system.svc:7070
      pathStyle: true
      caBundleFile: /etc/etcdbackup/s3-ca/ca.crt
      accessKeyIDFile: /etc/etcdbackup/s3-credentials/access-key-id
      secretAccessKeyFile: /etc/etcdbackup/s3-credentials/secret-access-key
targets:
  - name: control-plane
    endpoints: [https://etcd.kube-system.svc:2379]
    tlsSecret: etcd-client
  - name: quiet
    endpoints: [http://quiet.kube-system.svc:2379]
    insecurePlaintext: true
  - name: app-etcd
    endpoints: [http://etcd-0.app.svc:2379, http://etcd-1.app.svc:2379]
    insecurePlaintext: true
    location: s3
    namespace: app
    initialClusterToken: app-etcd-token
    members:
      - name: etcd-0
        peerURL: http://etcd-0.app.svc:2380
        clientURL: http://etcd-0.app.svc:2379
        dataDir: "data"
        volume: {persistentVolumeClaim: {claimName: data-etcd-0}}
      - name: etcd-1
        peerURL: http://etcd-1.app.svc:2380
        clientURL: http://etcd-1.app.svc:2379
        dataDir: ""
        volume: {persistentVolumeClaim: {claimName: data-etcd-1}}
agents:
  image: etcdbackup-agent:dev
  serviceAccount: etcdbackup-agent
`)
	if err != nil {
		t.Fatal(err)
	}
	s3 := f.Locations[1].S3
	if s3 == nil || s3.Bucket != "etcdbackup" || s3.Region != "us-east-1" || s3.SecretAccessKeyFile != "/etc/etcdbackup/s3-credentials/secret-access-key" {
		t.Errorf("s3: %+v", s3)
	}
	app := f.Targets[2]
	if !f.Targets[1].InsecurePlaintext || app.Location != "s3" || app.Members[1].DataDir != "" || app.Members[0].Volume.PersistentVolumeClaim.ClaimName != "data-etcd-0" {
		t.Errorf("targets: %+v", f.Targets)
	}
}
