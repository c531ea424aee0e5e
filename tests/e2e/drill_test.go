package e2e

import (
	"context"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/s3"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// drillIdentitySecret is the Secret in the server's namespace that holds
// the app target's age identity for its drills.
const drillIdentitySecret = "etcdbackup-drill-identity"

// testDrills drills app-1 of the encrypted app target (stored in S3)
// through the real plugin, server and a drill agent pod: without its
// identity Secret it reaches no verdict and says what to create; with
// it, it passes; with
// its bytes swapped in the bucket for another valid snapshot (app-2's)
// it fails, and so it does when its recorded HashKV is not the
// keyspace's; each verdict is in get, describe and the metrics.
func testDrills(ctx context.Context, t *testing.T, c *cluster, product *world.Product, identity string) {
	drill := []string{"etcdbackup", "drill", "app-1", "--location", "s3", "--wait", "--timeout", "5m"}
	verification := func(name string) string {
		return mustSucceed(t, c.run(t, nil, "etcdbackup", "get", name, "--location", "s3", "-o",
			`jsonpath={.status.verification.result}/{.status.verification.message}`), "get verification").Stdout
	}

	// What the target's retention would remove now, its on-demand backups
	// included (they are all this target has).
	prunable := func() string {
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "prune", "--target", appTarget, "--location", "s3", "--all", "--dry-run", "-o", "name"), "prune --dry-run")
		return r.Stdout
	}

	// Before its identity Secret exists the drill learns nothing: an
	// Error that says what to create, not a verdict against the backup.
	t.Run("without-its-identity", func(t *testing.T) {
		r := mustFail(t, c.run(t, nil, drill...), "drill without the identity Secret")
		if r.ExitCode != 1 || !strings.Contains(r.Stderr, "reached no verdict") || !strings.Contains(r.Stderr, "identitySecret") {
			t.Errorf("drill without its identity: exit %d, %s", r.ExitCode, r)
		}
		if v := verification("app-1"); !strings.HasPrefix(v, "Error/") || !strings.Contains(v, "nothing was learned") {
			t.Errorf("verification of app-1 without an identity: %q", v)
		}
	})

	if _, err := c.sb.Client().CoreV1().Secrets(world.DefaultNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: drillIdentitySecret},
		Data:       map[string][]byte{"key.txt": []byte(identity + "\n")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("passes", func(t *testing.T) {
		r := mustSucceed(t, c.run(t, nil, drill...), "drill --wait")
		if !strings.Contains(r.Stderr, "succeeded") {
			t.Errorf("drill --wait: %s", r)
		}
		if v := verification("app-1"); !strings.HasPrefix(v, "Succeeded/") || !strings.Contains(v, "as recorded") {
			t.Errorf("verification of app-1: %q", v)
		}
		d := mustSucceed(t, c.run(t, nil, "etcdbackup", "describe", "app-1", "--location", "s3"), "describe").Stdout
		if !strings.Contains(d, "Verification:") || !strings.Contains(d, "Succeeded") {
			t.Errorf("describe shows no verification:\n%s", d)
		}
		l := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "--location", "s3"), "list").Stdout
		if !strings.Contains(l, "VERIFIED") || strings.Contains(firstLineWith(l, "app-1"), "<none>") {
			t.Errorf("list shows app-1 unverified:\n%s", l)
		}
		// The target keeps its last 1 backup (app-2), and its newest
		// verified one although keepLast would remove it.
		if r := prunable(); strings.Contains(r, "app-1") {
			t.Errorf("retention (keepLast 1) would remove app-1, the newest verified backup: %s", r)
		}
	})

	t.Run("bytes-swapped-in-the-bucket", func(t *testing.T) {
		other, _ := readStored(ctx, t, product, "app-2")
		putBack := rewriteStored(ctx, t, product, "app-1", func(_ []byte, m *storage.Manifest) ([]byte, *storage.Manifest) { return other, m })
		defer putBack()
		r := mustFail(t, c.run(t, nil, drill...), "drill of swapped bytes")
		if r.ExitCode != 5 || !strings.Contains(r.Stderr, "failed its drill") {
			t.Errorf("drill of swapped bytes: exit %d, %s", r.ExitCode, r)
		}
		if v := verification("app-1"); !strings.HasPrefix(v, "Failed/") || !strings.Contains(v, "does not restore") {
			t.Errorf("verification of swapped app-1: %q", v)
		}
		// No longer verified, app-1 is what keepLast 1 removes.
		if r := prunable(); !strings.Contains(r, "app-1") {
			t.Errorf("retention (keepLast 1) of the target once app-1 failed its drill would not remove it: %s", r)
		}
	})

	t.Run("keyspace-differs", func(t *testing.T) {
		putBack := rewriteStored(ctx, t, product, "app-1", func(b []byte, m *storage.Manifest) ([]byte, *storage.Manifest) {
			m.Etcd.HashKV++
			return b, m
		})
		defer putBack()
		r := mustFail(t, c.run(t, nil, drill...), "drill of a backup whose keyspace differs")
		if r.ExitCode != 5 || !strings.Contains(r.Stderr, "differs from the cluster's") {
			t.Errorf("drill of a differing keyspace: exit %d, %s", r.ExitCode, r)
		}
		d := mustSucceed(t, c.run(t, nil, "etcdbackup", "describe", "app-1", "--location", "s3"), "describe").Stdout
		if !strings.Contains(d, "Failed") || !strings.Contains(d, "do not restore it") {
			t.Errorf("describe of the failed drill:\n%s", d)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		metrics := portForwardMetrics(ctx, t, c.kubectl, "deployment/etcdbackup-server")
		for result, want := range map[string]float64{"succeeded": 1, "failed": 2} {
			if v, ok := metricValue(t, metrics, `etcdbackup_drill_runs_total{result="`+result+`",target="`+appTarget+`"}`); !ok || v != want {
				t.Errorf("drill runs %s: %v (present %v), want %v", result, v, ok, want)
			}
		}
		// app-1, the one backup a drill verified, failed its later
		// drills: no backup of the target is verified any more.
		if v, ok := metricValue(t, metrics, `etcdbackup_last_verified_backup_timestamp_seconds{location="s3",target="`+appTarget+`"}`); !ok || v != 0 {
			t.Errorf("last verified backup: %v (present %v), want 0: its only verified backup failed its later drills", v, ok)
		}
	})
}

func firstLineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// readStored reads a backup's stored bytes and manifest straight from the
// bucket, as anyone holding its credentials can.
func readStored(ctx context.Context, t *testing.T, product *world.Product, name string) ([]byte, *storage.Manifest) {
	t.Helper()
	loc, err := s3.New(ctx, product.S3.Config("sandbox"))
	if err != nil {
		t.Fatal(err)
	}
	rc, m, err := loc.Open(ctx, name, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b, m
}

// rewriteStored replaces a backup in the bucket by what change makes of
// its bytes and manifest, as a writer of the bucket could; putBack
// restores it.
func rewriteStored(ctx context.Context, t *testing.T, product *world.Product, name string,
	change func([]byte, *storage.Manifest) ([]byte, *storage.Manifest)) (putBack func()) {
	t.Helper()
	loc, err := s3.New(ctx, product.S3.Config("sandbox"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(b []byte, m *storage.Manifest) {
		if err := loc.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		u, err := loc.Create(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := u.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := u.Commit(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	own, m := readStored(ctx, t, product, name)
	keep := *m
	keepEtcd := *m.Etcd
	keep.Etcd = &keepEtcd
	write(change(own, m))
	return func() { write(own, &keep) }
}
