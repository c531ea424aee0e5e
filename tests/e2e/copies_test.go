package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// Copies on the installed product (issue 40): location default, where
// the live target's agents store, copies everything to location s3, the
// sandbox's versitygw.
//
//   - a full backup and its delta segments reach s3 with equal SHA-256;
//   - s3's server stopped for a minute: copies pend, the lag metric
//     rises; started again, the copies catch up (the lag falls, pending
//     returns to 0) and the chain in s3 equals the chain in default;
//   - a backup deleted from default: download, drill and a break-glass
//     restore (the API server out of the way, only s3's credentials)
//     read its copy, and the restored member reads back the keys.
func TestCopies(t *testing.T) {
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}

	src := newMembers(t, 1)
	startMembers(t, src)
	ec := etcdClient(t, src)
	for i := range 20 {
		put(t, ec, fmt.Sprintf("/registry/copies/%02d", i), strings.Repeat("c", 100))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	product, err := world.InstallProductWith(ctx, sb, k, t.TempDir(), &testLog{t: t, prefix: "install: "}, world.ProductOptions{
		Images:        im,
		PlainTargets:  []world.PlainTarget{{Name: "live", Addr: src[0].clientURL.Host, DeltaPeriod: "2s"}},
		CopyDefaultTo: "s3",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			r := c.run(t, nil, "-n", world.DefaultNamespace, "logs", "deployment/etcdbackup-server", "--tail=80")
			t.Logf("server log:\n%s", r.Stdout)
		}
	})
	metrics := portForwardMetrics(ctx, t, k, "deployment/etcdbackup-server")
	series := func(name string) float64 {
		v, _ := metricValue(t, metrics, name+`{copy="s3",location="default"}`)
		return v
	}
	copyState := func(name string) string {
		return c.run(t, nil, "etcdbackup", "get", name, "--location", "default", "-o", "jsonpath={.status.copies[0].state}").Stdout
	}
	shaIn := func(name, location string) string {
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "get", name, "--location", location, "-o", "jsonpath={.status.sha256}"), "get "+name+" in "+location)
		return r.Stdout
	}
	chainIn := func(full, location string) deltaChain {
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "get", full, "--location", location, "-o", "json"), "get "+full)
		var b backupJSON
		if err := json.Unmarshal([]byte(r.Stdout), &b); err != nil || b.Status.Chain == nil {
			return deltaChain{}
		}
		return *b.Status.Chain
	}

	load := startWriteLoad(ctx, t, ec, 20)
	defer load.stop()
	var full string
	pollUntil(ctx, t, "a full backup of live with a growing delta chain", func() bool {
		full = chainGrowing(t, c, "live")
		return full != ""
	})

	t.Run("backup-and-segment-reach-the-copy", func(t *testing.T) {
		waitFor(ctx, t, 2*time.Minute, full+" copied to s3", func() bool { return copyState(full) == "Copied" })
		if a, b := shaIn(full, "default"), shaIn(full, "s3"); a == "" || a != b {
			t.Errorf("SHA-256 of %s: %q in default, %q in s3", full, a, b)
		}
		// A segment, named as the copy location stores it.
		var segment string
		waitFor(ctx, t, time.Minute, "a delta segment of "+full+" in s3", func() bool {
			out, err := product.S3.Client().ListObjectsV2(ctx, &s3sdk.ListObjectsV2Input{Bucket: aws.String(product.S3.Bucket), Prefix: aws.String("sandbox/backups/" + full + ".delta-")})
			if err != nil {
				return false
			}
			for _, o := range out.Contents {
				if n, ok := strings.CutSuffix(strings.TrimPrefix(aws.ToString(o.Key), "sandbox/backups/"), ".json"); ok {
					segment = n
					return true
				}
			}
			return false
		})
		if a, b := shaIn(segment, "default"), shaIn(segment, "s3"); a == "" || a != b {
			t.Errorf("SHA-256 of segment %s: %q in default, %q in s3", segment, a, b)
		}
		if got := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "--location", "default"), "list").Stdout; !strings.Contains(got, "COPIES") || !strings.Contains(got, "2/2") {
			t.Errorf("list does not show the copy:\n%s", got)
		}
	})

	t.Run("copy-location-down-a-minute", func(t *testing.T) {
		product.S3.Kill()
		down := time.Now()
		waitFor(ctx, t, 2*time.Minute, "copies pending while s3 is down", func() bool { return series("etcdbackup_copies_pending") > 0 })
		var peak float64
		waitFor(ctx, t, 3*time.Minute, "s3 down a minute, the lag over 30 s", func() bool {
			peak = series("etcdbackup_copy_lag_seconds")
			return time.Since(down) >= time.Minute && peak >= 30
		})
		if err := product.S3.Restart(); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, 3*time.Minute, "the copies to catch up", func() bool {
			return series("etcdbackup_copies_pending") == 0 && series("etcdbackup_copy_lag_seconds") < peak
		})
		t.Logf("s3 down %s: the lag peaked at %.0f s, then fell to %.0f s; %v copy attempts failed",
			time.Since(down).Round(time.Second), peak, series("etcdbackup_copy_lag_seconds"), series("etcdbackup_copy_failures_total"))
		// Nothing lost: with the writes stopped, the chain in s3 is the
		// chain in default, segment for segment.
		load.stop()
		waitFor(ctx, t, 2*time.Minute, "the chain in s3 to equal the chain in default", func() bool {
			a, b := chainIn(full, "default"), chainIn(full, "s3")
			return a.Segments > 0 && a == b
		})
	})

	t.Run("primary-gone-the-copy-serves", func(t *testing.T) {
		const name = "live-copied"
		mustSucceed(t, c.run(t, nil, "etcdbackup", "backup", "--target", "live", "--name", name, "--wait"), "backup")
		waitFor(ctx, t, 2*time.Minute, name+" copied to s3", func() bool { return copyState(name) == "Copied" })
		raw := c.run(t, nil, "etcdbackup", "get", name, "--location", "default", "-o", "jsonpath={.status.rawSha256}").Stdout
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "delete", name, "--location", "default", "--yes"), "delete in default")
		if !strings.Contains(r.Stderr, "s3") {
			t.Errorf("delete did not say the copy in s3 is kept: %s", r)
		}

		file := filepath.Join(t.TempDir(), name+".db")
		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "download", name, "-o", file), "download of the copy")
		if !strings.Contains(r.Stderr, `"s3"`) {
			t.Errorf("download did not say it read the copy in s3: %s", r)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != raw {
			t.Errorf("the copy downloaded hashes to %x, the backup recorded %s", sum, raw)
		}

		r = mustSucceed(t, c.run(t, nil, "etcdbackup", "drill", name, "--wait", "--timeout", "5m"), "drill of the copy")
		if !strings.Contains(r.Stdout+r.Stderr, "s3") {
			t.Errorf("drill did not say it used the copy in s3: %s", r)
		}

		// Break-glass: no kubeconfig, only the copy location's
		// configuration and credentials.
		storageConfig := copyStorageConfig(t, c, product)
		restored := &etcdMember{name: "r1", dataDir: filepath.Join(t.TempDir(), "r1.etcd"), clientURL: freeLoopbackURL(t), peerURL: freeLoopbackURL(t)}
		r = mustSucceed(t, c.run(t, []string{"KUBECONFIG=" + os.DevNull}, "etcdbackup", "restore", name, "--local", "--storage-config", storageConfig,
			"--data-dir", restored.dataDir, "--member-name", restored.name, "--initial-cluster", restored.name+"="+restored.peerURL.String(),
			"--initial-advertise-peer-urls", restored.peerURL.String(), "--initial-cluster-token", "e2e-cluster"), "break-glass restore of the copy")
		t.Logf("break-glass restore from the copy:\n%s%s", r.Stdout, r.Stderr)
		rs := []*etcdMember{restored}
		t.Cleanup(func() { stopMembers(rs) })
		startMembers(t, rs)
		if got := get(t, etcdClient(t, rs), "/registry/copies/07"); got != strings.Repeat("c", 100) {
			t.Errorf("the member restored from the copy reads %q", got)
		}
	})
}
