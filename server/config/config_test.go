package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
  # A target's members are all claims or all hostPaths.
  - name: control-plane
    endpoints: [https://10.0.0.10:2379]
    members:
      - name: cp-1
        peerURL: https://10.0.0.10:2380
        volume: {hostPath: {path: /var/lib}}
        dataDir: etcd
        nodeName: cp-1
`)
	if err != nil {
		t.Fatal(err)
	}
	ts := f.Targets
	m := append(ts[0].Members, ts[1].Members...)
	if ts[0].Namespace != "app" || ts[0].InitialClusterToken != "tok" || len(m) != 2 ||
		m[0].Volume.PersistentVolumeClaim.ClaimName != "data-etcd-0" || m[0].DataDir != "data" ||
		m[1].Volume.HostPath.Path != "/var/lib" || m[1].NodeName != "cp-1" {
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

// TestErrorsNameTheField: each bad config is refused with an error that
// names the field to fix, as a user reads it in the server's log.
func TestErrorsNameTheField(t *testing.T) {
	const member = "      - name: m0\n        peerURL: http://m0:2380\n        volume: {persistentVolumeClaim: {claimName: c}}\n"
	for _, tc := range []struct {
		name, config, want string
	}{
		{"no locations", "targets: []\n", "locations: Required value"},
		{"location without backend", "locations:\n  - name: a\n", "locations[0]: Required value: must have exactly one of filesystem, s3"},
		{"location with two backends", "locations:\n  - name: a\n    filesystem: {path: /x}\n    s3: {bucket: b}\n",
			"locations[0]: Invalid value: must have exactly one of filesystem, s3"},
		{"s3 without bucket", "locations:\n  - name: a\n    s3: {defaultCredentialChain: true}\n", "locations[0].s3.bucket: Required value"},
		{"s3 without credentials", "locations:\n  - name: a\n    s3: {bucket: b}\n", "locations[0].s3: Required value: no credentials configured"},
		{"s3 part size", "locations:\n  - name: a\n    s3: {bucket: b, defaultCredentialChain: true, partSizeMiB: 4}\n", "locations[0].s3.partSizeMiB: Invalid value: 4"},
		{"s3 endpoint", "locations:\n  - name: a\n    s3: {bucket: b, defaultCredentialChain: true, endpoint: \"https://key:hunter2@s3.example\"}\n",
			`locations[0].s3.endpoint: Invalid value: "https://key:xxxxx@s3.example": must not contain credentials`},
		{"filesystem without path", "locations:\n  - name: a\n    filesystem: {}\n", "locations[0].filesystem.path: Required value"},
		{"location name", "locations:\n  - name: Default\n    filesystem: {path: /x}\n", `locations[0].name: Invalid value: "Default"`},
		{"empty location name", "locations:\n  - filesystem: {path: /x}\n", "locations[0].name: Required value"},
		{"duplicate location", "locations:\n  - name: a\n    filesystem: {path: /x}\n  - name: a\n    filesystem: {path: /y}\n",
			`locations[1].name: Duplicate value: "a"`},
		{"target name", head[:strings.Index(head, "targets:")] + "targets:\n  - name: my_etcd\n    endpoints: [http://e:2379]\n",
			`targets[0].name: Invalid value: "my_etcd"`},
		{"duplicate target", head + member + "  - name: app\n    endpoints: [http://e:2379]\n", `targets[1].name: Duplicate value: "app"`},
		{"no endpoints", head[:strings.Index(head, "targets:")] + "targets:\n  - name: t\n", "targets[0].endpoints: Required value"},
		{"unknown location", head + member + "    location: s3\n", `targets[0].location: Not found: "s3"`},
		{"compression", head + member + "    compression: gzip\n", `targets[0].compression: Unsupported value: "gzip": supported values: "none", "zstd"`},
		{"namespace", head[:strings.Index(head, "targets:")] + "targets:\n  - name: t\n    endpoints: [http://e:2379]\n    namespace: App\n",
			`targets[0].namespace: Invalid value: "App"`},
		{"negative uid", head + member + "    restoreRunAsUser: -1\n", "targets[0].restoreRunAsUser: Invalid value: -1: must not be negative"},
		{"member without name", head + "      - peerURL: http://m0:2380\n        volume: {persistentVolumeClaim: {claimName: c}}\n",
			"targets[0].members[0].name: Required value"},
		{"duplicate member", head + member + member, `targets[0].members[1].name: Duplicate value: "m0"`},
		{"peer URL", head + "      - name: m0\n        peerURL: m0:2380\n        volume: {persistentVolumeClaim: {claimName: c}}\n",
			`targets[0].members[0].peerURL: Invalid value: "m0:2380": must be an http:// or https:// URL`},
		{"client URL", head + member + "        clientURL: ftp://m0\n", `targets[0].members[0].clientURL: Invalid value: "ftp://m0"`},
		{"data dir", head + member + "        dataDir: ../etcd\n",
			`targets[0].members[0].dataDir: Invalid value: "../etcd": must be a clean path relative to the volume's root`},
		{"no volume", head + member + "      - name: m1\n        peerURL: http://m1:2380\n",
			"targets[0].members[1].volume: Invalid value: must have exactly one of persistentVolumeClaim, hostPath"},
		{"claim name", head + "      - name: m0\n        peerURL: http://m0:2380\n        volume: {persistentVolumeClaim: {}}\n",
			"targets[0].members[0].volume.persistentVolumeClaim.claimName: Required value"},
		{"node name with claim", head + member + "        nodeName: n\n", "targets[0].members[0].nodeName: Forbidden: goes with hostPath volumes only"},
		{"hostPath without node", head + "      - name: m0\n        peerURL: http://m0:2380\n        volume: {hostPath: {path: /var/lib}}\n",
			"targets[0].members[0].nodeName: Required value"},
		{"relative hostPath", head + "      - name: m0\n        peerURL: http://m0:2380\n        volume: {hostPath: {path: var/lib}}\n        nodeName: n\n",
			`targets[0].members[0].volume.hostPath.path: Invalid value: "var/lib": must be an absolute path`},
		{"claims and hostPaths", head + member + "      - name: m1\n        peerURL: http://m1:2380\n        volume: {hostPath: {path: /var/lib}}\n        nodeName: n\n",
			"targets[0].members[1].volume: Invalid value: every member of a target uses persistentVolumeClaim, or every member hostPath"},
		{"restore namespace", head + member + "agents: {restoreNamespace: Etcd_Restore}\n", `agents.restoreNamespace: Invalid value: "Etcd_Restore"`},
		{"negative deadline", head + member + "agents: {deadline: -1m}\n", `agents.deadline: Invalid value: "-1m0s": must not be negative`},
		{"pull policy", head + member + "agents: {imagePullPolicy: Sometimes}\n", `agents.imagePullPolicy: Unsupported value: "Sometimes"`},
		{"bad duration", head + member + "agents: {ttlAfterFinished: 1 day}\n", `duration "1 day"`},
		{"unknown key", head + member + "    endpoint: [http://e:2379]\n", `unknown field "endpoint"`},
		{"schedule", head + member + "    schedule: \"0 25 * * *\"\n", `targets[0].schedule: Invalid value: "0 25 * * *": cron expression`},
		{"time zone", head + member + "    schedule: \"@daily\"\n    timeZone: Mars/Olympus\n", `targets[0].timeZone: Invalid value: "Mars/Olympus": unknown time zone`},
		{"time zone without schedule", head + member + "    timeZone: UTC\n", `targets[0].timeZone: Invalid value: "UTC": needs a schedule`},
		{"starting deadline", head + member + "    schedule: \"@daily\"\n    startingDeadline: -1m\n", `targets[0].startingDeadline: Invalid value: "-1m0s": must be positive`},
		{"empty retention", head + member + "    retention: {}\n", "targets[0].retention: Required value: at least one of keepLast, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly or maxAge"},
		{"negative keepLast", head + member + "    retention: {keepLast: -2}\n", "targets[0].retention.keepLast: Invalid value: -2"},
		{"negative keepWeekly", head + member + "    retention: {keepDaily: 7, keepWeekly: -1}\n", "targets[0].retention.keepWeekly: Invalid value: -1"},
		{"time zone with a retention that counts only", head + member + "    timeZone: Europe/Berlin\n    retention: {keepLast: 3}\n",
			`targets[0].timeZone: Invalid value: "Europe/Berlin": needs a schedule, or a retention that counts hours, days, weeks, months or years`},
		{"compactAfterRevisions too small", head + member + "    deltas: {compactAfterRevisions: 999}\n",
			"targets[0].deltas.compactAfterRevisions: Invalid value: 999: must be 0 (never fold chains) or at least 1000"},
		{"compactAfterRevisions negative", head + member + "    deltas: {compactAfterRevisions: -1}\n", "targets[0].deltas.compactAfterRevisions: Invalid value: -1"},
		{"fold of an encrypted target without identity", head + member +
			"    encryption: {ageRecipients: [age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p]}\n    deltas: {compactAfterRevisions: 1000}\n",
			"targets[0].deltas.identitySecret: Required value"},
		{"negative replicas", "replicas: -1\nlocations:\n  - name: a\n    s3: {bucket: b, defaultCredentialChain: true}\n",
			"replicas: Invalid value: -1: must not be negative"},
		{"replicas on a ReadWriteOnce volume", "replicas: 2\n" + head + member,
			"locations[0].filesystem.sharedVolume: Invalid value: false: replicas is 2, but this location is not marked as shared: a ReadWriteOnce volume mounts on one node only"},
		{"copy to itself", "locations:\n  - name: a\n    filesystem: {path: /x}\n    copies: [{to: a}]\n",
			`locations[0].copies[0].to: Invalid value: "a": a location cannot be its own copy`},
		{"copy to nowhere", "locations:\n  - name: a\n    filesystem: {path: /x}\n    copies: [{to: offsite}]\n",
			`locations[0].copies[0].to: Not found: "offsite"`},
		{"copy twice", "locations:\n  - name: a\n    filesystem: {path: /x}\n    copies: [{to: b}, {to: b}]\n  - name: b\n    filesystem: {path: /y}\n",
			`locations[0].copies[1].to: Duplicate value: "b"`},
		{"copies in a cycle", "locations:\n  - name: a\n    filesystem: {path: /x}\n    copies: [{to: b}]\n  - name: b\n    filesystem: {path: /y}\n    copies: [{to: a}]\n",
			`locations[0].copies: Invalid value: location "a" is copied back to itself through its copies`},
		{"copy retention of no copy location", strings.Replace(head, "    filesystem: {path: /tmp/x}\n", "    filesystem: {path: /tmp/x}\n  - name: other\n    filesystem: {path: /tmp/y}\n", 1) + member +
			"    copyRetention: {other: {keepLast: 2}}\n",
			`targets[0].copyRetention[other]: Invalid value: "other": is not a copy location of the target's location "default"`},
		{"copy retention of an unknown location", head + member + "    copyRetention: {offsite: {keepLast: 2}}\n", `targets[0].copyRetention[offsite]: Not found: "offsite"`},
		{"empty copy retention", strings.Replace(head, "    filesystem: {path: /tmp/x}\n", "    filesystem: {path: /tmp/x}\n    copies: [{to: offsite}]\n  - name: offsite\n    filesystem: {path: /tmp/y}\n", 1) + member +
			"    copyRetention: {offsite: {}}\n",
			"targets[0].copyRetention[offsite]: Required value: at least one of keepLast"},
		{"fold identity secret name", head + member + "    deltas: {compactAfterRevisions: 1000, identitySecret: Fold_Key}\n",
			`targets[0].deltas.identitySecret: Invalid value: "Fold_Key"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.config)
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.config)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n  %v\ndoes not say\n  %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error shows a credential: %v", err)
			}
		})
	}
}

// TestPackageExample loads the example of the package documentation, so
// the documented format is one the server accepts.
func TestPackageExample(t *testing.T) {
	src, err := os.ReadFile("config.go")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for line := range strings.SplitSeq(string(src), "\n") {
		if y, ok := strings.CutPrefix(line, "//\t"); ok {
			b.WriteString(y + "\n")
		}
	}
	f, err := load(t, b.String())
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if len(f.Locations) != 2 || f.Locations[1].S3 == nil || f.Locations[1].S3.Bucket != "etcd-backups" || !f.Locations[1].S3.PathStyle {
		t.Errorf("locations: %+v", f.Locations)
	}
	if len(f.Targets) != 2 || f.Targets[0].Compression != "zstd" || f.Targets[0].Location != "s3" ||
		f.Targets[1].RestoreRunAsUser == nil || *f.Targets[1].RestoreRunAsUser != 1001 || len(f.Targets[1].Members) != 1 {
		t.Errorf("targets: %+v", f.Targets)
	}
	if f.Agents.TTLAfterFinished.Duration != 24*time.Hour || f.Agents.Deadline.Duration != 2*time.Hour {
		t.Errorf("agents: %+v", f.Agents)
	}
}

func TestDurations(t *testing.T) {
	f, err := load(t, head+"      - name: m0\n        peerURL: http://m0:2380\n        volume: {persistentVolumeClaim: {claimName: c}}\n"+
		"agents:\n  ttlAfterFinished: 90s\n  deadline: 2h\n")
	if err != nil {
		t.Fatal(err)
	}
	if f.Agents.TTLAfterFinished.Duration != 90*time.Second || f.Agents.Deadline.Duration != 2*time.Hour {
		t.Fatalf("agents: %+v", f.Agents)
	}
	a := f.Agents.WithDefaults("ns")
	if a.TTLAfterFinished.Duration != 90*time.Second || a.Deadline.Duration != 2*time.Hour {
		t.Errorf("defaults replaced configured durations: %+v", a)
	}
	d := Agents{}.WithDefaults("ns")
	if d.TTLAfterFinished.Duration != DefaultTTLAfterFinished || d.Deadline.Duration != DefaultDeadline ||
		d.ServiceAccount != DefaultServiceAccount || d.ServerAddress != "etcdbackup.ns.svc:50052" {
		t.Errorf("defaults: %+v", d)
	}
}

func TestEncryptionRecipients(t *testing.T) {
	const good = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
	const secret = "AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX"
	base := head[:strings.Index(head, "targets:")] + "targets:\n  - name: t\n    endpoints: [http://e:2379]\n"
	f, err := load(t, base+"    encryption: {ageRecipients: ["+good+"]}\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Targets[0].AgeRecipients(); len(got) != 1 || got[0] != good || f.Targets[0].EncryptionName() != "age" {
		t.Fatalf("recipients %v", got)
	}
	for _, tc := range []struct{ name, enc, want string }{
		{"none", "    encryption: {ageRecipients: []}\n", "targets[0].encryption.ageRecipients: Required value"},
		{"not a key", "    encryption: {ageRecipients: [" + good + ", age1nope]}\n", "targets[0].encryption.ageRecipients[1]: Invalid value"},
		{"secret key", "    encryption: {ageRecipients: [" + secret + "]}\n", "targets[0].encryption.ageRecipients[0]: Invalid value: this is an age identity (a secret key)"},
		{"unknown key", "    encryption: {ageRecipient: [" + good + "]}\n", `unknown field "ageRecipient"`},
	} {
		_, err := load(t, base+tc.enc)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error repeats the secret key", tc.name)
		}
	}
}

// A target's compression is spelled as the CLI spells it: none or zstd
// (and "" for none).
func TestTargetCompressionNone(t *testing.T) {
	for _, c := range []string{"none", "zstd", `""`} {
		if _, err := load(t, head[:strings.Index(head, "targets:")]+"targets:\n  - name: t\n    endpoints: [http://e:2379]\n    compression: "+c+"\n"); err != nil {
			t.Errorf("compression: %s: %v", c, err)
		}
	}
}

// A fold threshold is accepted from 1000 revisions on, and 0 is never.
func TestDeltasCompactAfterRevisions(t *testing.T) {
	base := head[:strings.Index(head, "targets:")] + "targets:\n  - name: t\n    endpoints: [http://e:2379]\n"
	for _, v := range []string{"0", "1000", "5000000"} {
		f, err := load(t, base+"    deltas: {compactAfterRevisions: "+v+"}\n")
		if err != nil {
			t.Fatalf("compactAfterRevisions %s: %v", v, err)
		}
		if got := f.Targets[0].Deltas.CompactAfterRevisions; fmt.Sprint(got) != v {
			t.Fatalf("compactAfterRevisions %s read as %d", v, got)
		}
	}
}

// TestReplicas: more than one replica is accepted when every location
// is one all of them can write: S3, or a filesystem marked sharedVolume.
func TestReplicas(t *testing.T) {
	for _, c := range []string{
		"locations:\n  - name: a\n    filesystem: {path: /x}\n",
		"replicas: 1\nlocations:\n  - name: a\n    filesystem: {path: /x}\n",
		"replicas: 3\nlocations:\n  - name: a\n    s3: {bucket: b, defaultCredentialChain: true}\n  - name: c\n    filesystem: {path: /x, sharedVolume: true}\n",
	} {
		if _, err := load(t, c); err != nil {
			t.Errorf("refused %v:\n%s", err, c)
		}
	}
	_, err := load(t, "replicas: 2\nlocations:\n  - name: a\n    s3: {bucket: b, defaultCredentialChain: true}\n  - name: c\n    filesystem: {path: /x}\n")
	if err == nil || !strings.Contains(err.Error(), "locations[1].filesystem.sharedVolume") || strings.Contains(err.Error(), "locations[0]") {
		t.Errorf("a filesystem location not shared beside an s3 one: %v", err)
	}
}

// A recovery kit is refused at startup without recipients (it holds the
// cluster's CA key), without its node, with a path that cannot be
// mounted, and on a target whose members run in pods; a secret key given
// as a recipient is never repeated.
func TestKit(t *testing.T) {
	const good = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
	const secret = "AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX"
	base := head[:strings.Index(head, "targets:")] + "targets:\n  - name: t\n    endpoints: [http://e:2379]\n"
	f, err := load(t, base+"    kit: {nodeName: cp-1, ageRecipients: ["+good+"]}\n")
	if err != nil {
		t.Fatal(err)
	}
	if k := f.Targets[0].Kit; k == nil || k.NodeName != "cp-1" || len(k.KitPaths()) != 1 || k.KitPaths()[0] != "/etc/kubernetes" {
		t.Fatalf("kit %+v; want kubeadm's /etc/kubernetes by default", k)
	}
	for _, tc := range []struct{ name, kit, want string }{
		{"no recipients", "    kit: {nodeName: cp-1}\n", "targets[0].kit.ageRecipients: Required value: the age public keys"},
		{"secret key", "    kit: {nodeName: cp-1, ageRecipients: [" + secret + "]}\n", "targets[0].kit.ageRecipients[0]: Invalid value: this is an age identity"},
		{"no node", "    kit: {ageRecipients: [" + good + "]}\n", "targets[0].kit.nodeName: Required value"},
		{"relative path", "    kit: {nodeName: cp-1, paths: [etc/kubernetes], ageRecipients: [" + good + "]}\n", "targets[0].kit.paths[0]: Invalid value"},
		{"the whole host", "    kit: {nodeName: cp-1, paths: [/], ageRecipients: [" + good + "]}\n", "is the whole host"},
		{"members in claims", "    kit: {nodeName: cp-1, ageRecipients: [" + good + "]}\n    members:\n      - {name: m0, peerURL: http://m0:2380, volume: {persistentVolumeClaim: {claimName: d}}}\n",
			"targets[0].kit: Invalid value: a recovery kit holds a control-plane node's files"},
	} {
		_, err := load(t, base+tc.kit)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error repeats the secret key", tc.name)
		}
	}
}

// Grandfather-father-son rules load with the target's time zone, which a
// calendar rule needs even without a schedule.
func TestRetentionCalendarRules(t *testing.T) {
	base := head[:strings.Index(head, "targets:")] + "targets:\n  - name: t\n    endpoints: [http://e:2379]\n"
	f, err := load(t, base+"    timeZone: Europe/Berlin\n    retention: {keepLast: 3, keepHourly: 24, keepDaily: 7, keepWeekly: 4, keepMonthly: 12, keepYearly: 3, maxAge: 8760h}\n")
	if err != nil {
		t.Fatal(err)
	}
	r := f.Targets[0].Retention
	if got := fmt.Sprint(r.KeepLast, r.KeepHourly, r.KeepDaily, r.KeepWeekly, r.KeepMonthly, r.KeepYearly, r.MaxAge.Duration); got != "3 24 7 4 12 3 8760h0m0s" || !r.Calendar() {
		t.Fatalf("retention read as %s", got)
	}
}
