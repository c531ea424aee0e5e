package retention_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/retention"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

func TestSelectPrunable(t *testing.T) {
	base := backuptest.MustTime(t, "2026-12-01T00:00:00Z")
	m := func(name string, hoursAgo int, scheduled bool, target string) *storage.Manifest {
		man := &storage.Manifest{Name: name, CreateTime: base.Add(-time.Duration(hoursAgo) * time.Hour), Source: storage.Source{Kind: ebv1.SourceAgent, Target: target}}
		man.Source.Scheduled = scheduled
		return man
	}
	all := []*storage.Manifest{
		m("s1", 1, true, "cp"), m("s2", 2, true, "cp"), m("s3", 3, true, "cp"), m("s4", 50, true, "cp"),
		m("d1", 0, false, "cp"), m("d2", 60, false, "cp"),
		m("other", 100, true, "app"),
		{Name: "upload", CreateTime: base.Add(-200 * time.Hour), Source: storage.Source{Kind: ebv1.SourceUpload}},
		// Labels decide nothing: an upload that carries the server's
		// labels (stored before they were refused) is no scheduled backup,
		// nor is another target's agent backup labelled as cp's.
		{Name: "upload-labelled", CreateTime: base.Add(-300 * time.Hour), Source: storage.Source{Kind: ebv1.SourceUpload},
			Labels: map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: "cp"}},
		{Name: "app-labelled", CreateTime: base.Add(-300 * time.Hour), Source: storage.Source{Kind: ebv1.SourceAgent, Target: "app"},
			Labels: map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: "cp"}},
	}
	names := func(ms []*storage.Manifest) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		r    config.Retention
		all  bool
		want []string
	}{
		{"keepLast 2: scheduled only", config.Retention{KeepLast: 2}, false, []string{"s3", "s4"}},
		{"keepLast 2 with unscheduled", config.Retention{KeepLast: 2}, true, []string{"s2", "s3", "s4", "d2"}},
		{"maxAge 24h", config.Retention{MaxAge: metav1.Duration{Duration: 24 * time.Hour}}, false, []string{"s4"}},
		{"both: either removes", config.Retention{KeepLast: 3, MaxAge: metav1.Duration{Duration: 150 * time.Minute}}, false, []string{"s3", "s4"}},
		{"never the newest, however old", config.Retention{KeepLast: 1, MaxAge: metav1.Duration{Duration: time.Minute}}, false, []string{"s2", "s3", "s4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backuptest.Equal(t, "prunable", names(retention.Select(all, "cp", tc.r, tc.all, base)), tc.want)
		})
	}
	// The newest of a target stays even when every one is past maxAge.
	old := []*storage.Manifest{m("a", 100, true, "cp"), m("b", 200, true, "cp")}
	backuptest.Equal(t, "prunable of old ones", names(retention.Select(old, "cp", config.Retention{MaxAge: metav1.Duration{Duration: time.Hour}}, false, base)), []string{"b"})
}

// Which manifests are scheduled backups: the source's word; labels only
// on an agent's backup of that target stored before the source said it.
func TestScheduledOf(t *testing.T) {
	labels := map[string]string{retention.LabelScheduled: "true", retention.LabelTarget: "cp"}
	at := backuptest.MustTime(t, "2026-12-01T09:00:00Z")
	for _, tc := range []struct {
		name string
		m    storage.Manifest
		want string
	}{
		{"scheduled agent backup", storage.Manifest{Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Scheduled: true, ScheduledTime: at}}, "cp"},
		{"on-demand agent backup", storage.Manifest{Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp"}}, ""},
		{"agent backup labelled by an earlier server", storage.Manifest{Labels: labels, Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp"}}, "cp"},
		{"agent backup of another target labelled cp", storage.Manifest{Labels: labels, Source: storage.Source{Kind: ebv1.SourceAgent, Target: "app"}}, ""},
		{"upload labelled as scheduled", storage.Manifest{Labels: labels, Source: storage.Source{Kind: ebv1.SourceUpload}}, ""},
		{"upload claiming the field", storage.Manifest{Source: storage.Source{Kind: ebv1.SourceUpload, Target: "cp", Scheduled: true}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := retention.ScheduledOf(&tc.m)
			if got != tc.want || ok != (tc.want != "") {
				t.Fatalf("ScheduledOf: %q %v, want %q", got, ok, tc.want)
			}
		})
	}
}

// Retention never removes the newest backup a drill verified, however
// many newer ones keepLast keeps; a failed drill earns nothing.
func TestSelectKeepsTheNewestVerified(t *testing.T) {
	base := backuptest.MustTime(t, "2026-12-01T00:00:00Z")
	m := func(name string, hoursAgo int, result string) *storage.Manifest {
		man := &storage.Manifest{Name: name, CreateTime: base.Add(-time.Duration(hoursAgo) * time.Hour),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Scheduled: true}}
		if result != "" {
			man.Verification = &storage.Verification{Result: result}
		}
		return man
	}
	all := []*storage.Manifest{
		m("s1", 1, storage.VerificationFailed), m("s2", 2, ""), m("s3", 3, storage.VerificationSucceeded),
		m("s4", 4, storage.VerificationSucceeded), m("s5", 5, ""),
	}
	var got []string
	for _, p := range retention.Select(all, "cp", config.Retention{KeepLast: 1}, false, base) {
		got = append(got, p.Name)
	}
	backuptest.Equal(t, "prunable", got, []string{"s2", "s4", "s5"})
}

// A folded full (stored by a fold agent: an agent backup of its target,
// not scheduled) is left alone by the retention that follows scheduled
// runs, and counted with the target's other agent backups by `prune
// --all`.
func TestSelectFoldedFulls(t *testing.T) {
	base := backuptest.MustTime(t, "2026-12-01T00:00:00Z")
	fold := func(name string, hoursAgo int) *storage.Manifest {
		return &storage.Manifest{Name: name, CreateTime: base.Add(-time.Duration(hoursAgo) * time.Hour),
			Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Description: "job etcdbackup-system/fold-cp-fold-1200-0123456789"},
			Etcd:   &storage.EtcdInfo{Revision: 1200, SnapshotStatus: true, Keyspace: true}}
	}
	all := []*storage.Manifest{
		{Name: "s1", CreateTime: base.Add(-1 * time.Hour), Source: storage.Source{Kind: ebv1.SourceAgent, Target: "cp", Scheduled: true}},
		fold("cp-fold-1200", 2), fold("cp-fold-900", 30),
	}
	keep1 := config.Retention{KeepLast: 1}
	if got := retention.Select(all, "cp", keep1, false, base); len(got) != 0 {
		t.Fatalf("scheduled retention removes %s, a folded full", got[0].Name)
	}
	got := retention.Select(all, "cp", keep1, true, base)
	if len(got) != 2 || got[0].Name != "cp-fold-1200" || got[1].Name != "cp-fold-900" {
		t.Fatalf("prune --all removes %v; want both folded fulls beyond the newest", got)
	}
}
