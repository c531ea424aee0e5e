package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/world"
)

// deltaPeriod is the live target's deltas.period in TestDeltaCapture.
const deltaPeriod = 2 * time.Second

// Continuous delta capture on the installed product, under a steady
// write load on a real etcd (puts, deletes, transactions, keys on
// leases):
//
//   - with no full backup, the server takes one and starts the target's
//     delta agent on its chain; the lag stays below twice deltas.period
//     (the recovery point, reported with the bytes per 10,000 writes);
//   - the agent's pod killed mid-segment: its replacement takes the
//     Lease in a new epoch and resumes where the stored chain ends;
//   - a second agent pod of the same signed Job never holds the Lease,
//     so it never writes;
//   - restores to a revision inside a segment, to a segment's boundary,
//     to the newest event and to a time equal the source's keyspace at
//     that revision, key by key;
//   - etcd compacted past a stopped agent: its chain ends visibly, a full
//     backup follows and a new chain grows from it; no segment anywhere
//     leaves a gap or overlaps.
func TestDeltaCapture(t *testing.T) {
	sb, im := startSandbox(t)
	k := &world.Kubectl{Path: sb.KubectlPath(), Kubeconfig: sb.Kubeconfig(), PluginDir: binDir}
	c := &cluster{sb: sb, kubectl: k}

	src := newMembers(t, 1)
	startMembers(t, src)
	ec := etcdClient(t, src)
	for i := range 50 {
		put(t, ec, fmt.Sprintf("/registry/seed/%03d", i), strings.Repeat("s", 200))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	product, err := world.InstallProduct(ctx, sb, k, im, t.TempDir(), &testLog{t: t, prefix: "install: "},
		world.PlainTarget{Name: "live", Addr: src[0].clientURL.Host, DeltaPeriod: deltaPeriod.String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(product.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			r := c.run(t, nil, "-n", world.DefaultNamespace, "logs", "-l", "app.kubernetes.io/component=delta-agent", "--tail=40", "--prefix", "--all-containers")
			t.Logf("delta agent logs:\n%s\n%s", r.Stdout, r.Stderr)
			r = c.run(t, nil, "-n", world.DefaultNamespace, "logs", "deployment/etcdbackup-server", "--tail=60")
			t.Logf("server log:\n%s", r.Stdout)
		}
	})
	metrics := portForwardMetrics(ctx, t, k, "deployment/etcdbackup-server")

	const rate = 100 // writes per second
	load := startWriteLoad(ctx, t, ec, rate)
	defer load.stop()

	// The server took a full backup to start from, then the agent.
	var full string
	pollUntil(ctx, t, "a full backup of live with a growing delta chain", func() bool {
		full = chainGrowing(t, c, "live")
		return full != ""
	})
	t.Logf("chain started from full backup %s", full)

	t.Run("lease-through-the-server", func(t *testing.T) {
		// The agent holds its target's Lease through the server: its
		// ServiceAccount may touch no Lease, not the controller's, not
		// another target's (issue 37 #6).
		agent := "system:serviceaccount:" + world.DefaultNamespace + ":etcdbackup-agent"
		for _, verb := range []string{"get", "update", "create", "delete"} {
			for _, lease := range []string{"leases/etcdbackup-controller", "leases/etcdbackup-delta-live", "leases/etcdbackup-delta-other"} {
				if verb == "create" {
					lease = "leases"
				}
				r := c.run(t, nil, "auth", "can-i", verb, lease, "-n", world.DefaultNamespace, "--as", agent)
				if strings.TrimSpace(r.Stdout) != "no" {
					t.Errorf("kubectl auth can-i %s %s --as %s: %q, want no", verb, lease, agent, r.Stdout)
				}
			}
		}
		pod := deltaPods(ctx, t, c)[0]
		pollUntil(ctx, t, "the delta agent's pod holding Lease etcdbackup-delta-live", func() bool {
			r := c.run(t, nil, "-n", world.DefaultNamespace, "get", "lease", "etcdbackup-delta-live", "-o", "jsonpath={.spec.holderIdentity}")
			return strings.HasPrefix(r.Stdout, pod+"_")
		})
	})

	t.Run("recovery-point", func(t *testing.T) {
		// Sampled once a second for 30 s under the write load.
		var lags []float64
		series := `etcdbackup_delta_lag_seconds{target="live"}`
		for range 30 {
			if v, ok := metricValue(t, metrics, series); ok {
				lags = append(lags, v)
			}
			time.Sleep(time.Second)
		}
		if len(lags) < 20 {
			t.Fatalf("%s present in %d of 30 scrapes", series, len(lags))
		}
		slices.Sort(lags)
		median, worst := lags[len(lags)/2], lags[len(lags)-1]
		bytes, _ := metricValue(t, metrics, `etcdbackup_delta_bytes_total{target="live"}`)
		events, _ := metricValue(t, metrics, `etcdbackup_delta_events_total{target="live"}`)
		t.Logf("recovery point at %d writes/s, deltas.period %s: lag median %.2fs, worst %.2fs over %d scrapes; %.0f stored bytes per 10,000 writes (%.0f bytes, %.0f events)",
			rate, deltaPeriod, median, worst, len(lags), bytes/events*10000, bytes, events)
		if worst >= 2*deltaPeriod.Seconds() {
			t.Errorf("the lag reached %.2fs, want below twice deltas.period (%s)", worst, 2*deltaPeriod)
		}
	})

	t.Run("agent-killed", func(t *testing.T) {
		before := chainOf(t, c, full)
		pod := deltaPods(ctx, t, c)[0]
		mustSucceed(t, c.run(t, nil, "-n", world.DefaultNamespace, "delete", "pod", pod, "--grace-period=0", "--force"), "kill the delta agent")
		pollUntil(ctx, t, "a new delta agent holding the Lease in a later epoch, storing again", func() bool {
			now := chainOf(t, c, full)
			return now.Epoch > before.Epoch && now.LastRevision > before.LastRevision+rate
		})
	})

	t.Run("second-agent", func(t *testing.T) {
		// A second agent as someone with the same rights could start by
		// hand: a copy of the agent's pod, controlled by the same signed
		// Job, outside the Job's selector. It never holds the Lease, so
		// it never writes: the agent port admits it while the pod is the
		// Job's (it then waits for the Lease, which the server will not
		// let it take from the writer), and refuses it once the Job
		// controller has released the pod, moments after it appeared.
		before := chainOf(t, c, full)
		second := startSecondDeltaAgent(ctx, t, c)
		pollUntil(ctx, t, "the second delta agent running", func() bool { return podRunning(ctx, t, c, second) })
		// Beside the writer for longer than a Lease lasts.
		time.Sleep(20 * time.Second)
		after := chainOf(t, c, full)
		if after.Epoch != before.Epoch || after.LastRevision <= before.LastRevision {
			t.Errorf("with a second agent the chain went from epoch %d revision %d to epoch %d revision %d; want the same epoch, growing",
				before.Epoch, before.LastRevision, after.Epoch, after.LastRevision)
		}
		if holder := leaseHolder(ctx, t, c); strings.HasPrefix(holder, second+"_") {
			t.Errorf("the second agent %s holds the delta Lease (%s)", second, holder)
		}
		logs := mustSucceed(t, c.run(t, nil, "-n", world.DefaultNamespace, "logs", second), "logs of the second agent")
		if out := logs.Stdout + logs.Stderr; !strings.Contains(out, "another agent holds the delta Lease; waiting") && !strings.Contains(out, "is not controlled by a Job") {
			t.Errorf("the second agent says neither that it waits for the Lease nor that the server refuses it:\n%s", out)
		}
		mustSucceed(t, c.run(t, nil, "-n", world.DefaultNamespace, "delete", "pod", second, "--wait=false"), "stop the second agent")
	})

	t.Run("hand-made-pod-running-otherwise", func(t *testing.T) {
		// The same copy under the same signed Job, but running a backup
		// of its own with the delta agent's etcd credentials and token:
		// it is not the pod the Job runs, so the agent port refuses it
		// and nothing is stored.
		name := startHandMadeDeltaPod(ctx, t, c, "backup-by-hand", func(spec *corev1.PodSpec) {
			args := []string{"backup", "--name=stolen-by-hand"}
			for _, a := range spec.Containers[0].Args {
				for _, keep := range []string{"--server", "--token-file", "--server-ca", "--server-name", "--endpoints", "--cacert", "--cert", "--key", "--insecure-plaintext", "--location", "--compression", "--encrypt-to"} {
					if strings.HasPrefix(a, keep+"=") || a == keep {
						args = append(args, a)
					}
				}
			}
			spec.Containers[0].Args = args
			spec.RestartPolicy = corev1.RestartPolicyNever
		})
		// The Job controller releases a pod outside its selector (drops
		// its ownerReference) moments after it appears; before that the
		// agent port refuses it as not the pod the Job runs, after it as
		// no Job's pod (server/auth's unit tests hold the first case).
		phase, logs := waitPodDone(ctx, t, c.sb, world.DefaultNamespace, name)
		if phase != corev1.PodFailed || !strings.Contains(logs, "PermissionDenied") ||
			!(strings.Contains(logs, "is not the pod Job") || strings.Contains(logs, "is not controlled by a Job")) {
			t.Errorf("a hand-made pod under the delta Job that runs a backup ended %s: %s; want refused as not the Job's pod", phase, lastLines(logs, 5))
		}
		if r := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "-o", "name"), "list"); strings.Contains(r.Stdout, "stolen-by-hand") {
			t.Errorf("the hand-made pod stored a backup: %s", r.Stdout)
		}
	})

	load.stop()
	newest := load.lastRevision()
	pollUntil(ctx, t, fmt.Sprintf("the chain stored up to the last write, revision %d", newest), func() bool {
		return chainOf(t, c, full).LastRevision >= newest
	})
	segs := segmentsOf(t, c, full)
	checkContiguous(t, full, fullRevision(t, c, full), segs)
	var inside int64
	for _, s := range segs {
		if s.LastRevision-s.FirstRevision >= 2 && inside == 0 {
			inside = s.FirstRevision + (s.LastRevision-s.FirstRevision)/2
		}
	}
	boundary := segs[len(segs)/2].LastRevision
	if inside == 0 {
		t.Fatalf("no segment of %d holds three revisions", len(segs))
	}

	timed := segs[len(segs)/3]
	for _, p := range []struct {
		name, flag, value string
		want              int64
	}{
		{"inside-a-segment", "--to-revision", strconv.FormatInt(inside, 10), inside},
		{"segment-boundary", "--to-revision", strconv.FormatInt(boundary, 10), boundary},
		{"newest-event", "--to-revision", strconv.FormatInt(newest, 10), newest},
		// The time the agent saw a segment's last revision: that one.
		{"time", "--to-time", timed.LastTime.Format(time.RFC3339Nano), timed.LastRevision},
	} {
		t.Run("restore-"+p.name, func(t *testing.T) {
			restoreToPoint(t, c, "live", ec, p.flag, p.value, p.want)
		})
	}

	t.Run("compacted-past-the-agent", func(t *testing.T) {
		// Stop the agent (its Job suspended: it stores what it holds and
		// releases the Lease), let etcd move on and compact past it.
		job := deltaJob(ctx, t, c)
		mustSucceed(t, c.run(t, nil, "-n", world.DefaultNamespace, "patch", "job", job, "--type=merge", "-p", `{"spec":{"suspend":true}}`), "suspend the delta agent")
		pollUntil(ctx, t, "no delta agent pod", func() bool { return len(deltaPods(ctx, t, c)) == 0 })
		var rev int64
		for i := range 20 {
			r, err := ec.Put(ctx, fmt.Sprintf("/registry/after-stop/%02d", i), "x")
			if err != nil {
				t.Fatal(err)
			}
			rev = r.Header.Revision
		}
		if _, err := ec.Compact(ctx, rev); err != nil {
			t.Fatal(err)
		}
		mustSucceed(t, c.run(t, nil, "-n", world.DefaultNamespace, "patch", "job", job, "--type=merge", "-p", `{"spec":{"suspend":false}}`), "resume the delta agent")
		pollUntil(ctx, t, "the chain of "+full+" ended, saying why", func() bool {
			return chainOf(t, c, full).EndReason != ""
		})
		ended := chainOf(t, c, full)
		if !strings.Contains(ended.EndReason, "compact") {
			t.Errorf("the chain ended with %q, want it to say etcd compacted past it", ended.EndReason)
		}
		checkContiguous(t, full, fullRevision(t, c, full), segmentsOf(t, c, full))
		// A full backup follows and a new chain grows from it (the
		// writes stopped: one each time it looks).
		var next string
		n := 0
		pollUntil(ctx, t, "a new full backup of live with a growing chain", func() bool {
			n++
			put(t, ec, fmt.Sprintf("/registry/after-compaction/%03d", n), "y")
			next = chainGrowing(t, c, "live")
			return next != "" && next != full
		})
		if v, ok := metricValue(t, metrics, `etcdbackup_delta_chain_ends_total{target="live"}`); !ok || v < 1 {
			t.Errorf("etcdbackup_delta_chain_ends_total of live: %v (present %v), want at least 1", v, ok)
		}
		r := mustSucceed(t, c.run(t, nil, "etcdbackup", "list", "--target", "live"), "list --target")
		if !strings.Contains(r.Stdout, "Recoverable window of target \"live\"") {
			t.Errorf("list --target does not show the recoverable window:\n%s", r.Stdout)
		}
	})
}

// writeLoad writes to etcd at a steady rate until stopped: puts of new
// and existing keys, deletes, transactions of several operations and
// keys on leases.
type writeLoad struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	last   atomic.Int64
}

func startWriteLoad(ctx context.Context, t *testing.T, c *clientv3.Client, perSecond int) *writeLoad {
	ctx, cancel := context.WithCancel(ctx)
	w := &writeLoad{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		rng := rand.New(rand.NewPCG(1, 2))
		var lease clientv3.LeaseID
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			key := fmt.Sprintf("/registry/load/%04d", rng.IntN(500))
			var rev int64
			var err error
			switch i % 10 {
			case 0:
				var r *clientv3.DeleteResponse
				r, err = c.Delete(ctx, key)
				if err == nil {
					rev = r.Header.Revision
				}
			case 1:
				var r *clientv3.TxnResponse
				// Keys of one transaction must differ (etcd refuses
				// duplicates): two under key, one delete elsewhere.
				r, err = c.Txn(ctx).Then(clientv3.OpPut(key+"/a", "t"+strconv.Itoa(i)), clientv3.OpPut(key+"/b", strings.Repeat("b", rng.IntN(300))),
					clientv3.OpDelete(fmt.Sprintf("/registry/load/%04d", rng.IntN(500)))).Commit()
				if err == nil {
					rev = r.Header.Revision
				}
			case 2:
				if lease == 0 || i%200 == 2 {
					var g *clientv3.LeaseGrantResponse
					if g, err = c.Grant(ctx, 3600); err == nil {
						lease = g.ID
					}
				}
				if err == nil {
					var r *clientv3.PutResponse
					r, err = c.Put(ctx, "/registry/events/"+strconv.Itoa(i), "e", clientv3.WithLease(lease))
					if err == nil {
						rev = r.Header.Revision
					}
				}
			default:
				var r *clientv3.PutResponse
				r, err = c.Put(ctx, key, strings.Repeat("v", 50+rng.IntN(400)))
				if err == nil {
					rev = r.Header.Revision
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("write load: %v", err)
				}
				return
			}
			w.last.Store(max(w.last.Load(), rev))
		}
	}()
	return w
}

func (w *writeLoad) stop() {
	w.once.Do(func() { w.cancel(); <-w.done })
}

// lastRevision is the revision of the load's last write.
func (w *writeLoad) lastRevision() int64 { return w.last.Load() }

// deltaChain is status.chain of a full backup, as `get -o json` prints it.
type deltaChain struct {
	Segments     int64  `json:"segments"`
	LastRevision int64  `json:"lastRevision"`
	Epoch        int64  `json:"epoch"`
	EndReason    string `json:"endReason"`
}

type backupJSON struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Status struct {
		Etcd struct {
			Revision int64 `json:"revision"`
		} `json:"etcd"`
		Chain *deltaChain `json:"chain"`
		Delta *struct {
			Epoch         int64  `json:"epoch"`
			FirstRevision int64  `json:"firstRevision"`
			LastRevision  int64  `json:"lastRevision"`
			LastTime      string `json:"lastTime"`
			EndReason     string `json:"endReason"`
		} `json:"delta"`
	} `json:"status"`
}

func getBackup(t *testing.T, c *cluster, name string) backupJSON {
	t.Helper()
	r := mustSucceed(t, c.run(t, nil, "etcdbackup", "get", name, "-o", "json"), "get "+name)
	var b backupJSON
	if err := json.Unmarshal([]byte(r.Stdout), &b); err != nil {
		t.Fatalf("get %s -o json: %v\n%s", name, err, r.Stdout)
	}
	return b
}

func chainOf(t *testing.T, c *cluster, full string) deltaChain {
	t.Helper()
	if ch := getBackup(t, c, full).Status.Chain; ch != nil {
		return *ch
	}
	return deltaChain{}
}

func fullRevision(t *testing.T, c *cluster, full string) int64 {
	return getBackup(t, c, full).Status.Etcd.Revision
}

// listedBackups is what `list ARGS -o json` prints, newest first.
func listedBackups(t *testing.T, c *cluster, args ...string) []backupJSON {
	t.Helper()
	what := strings.Join(append([]string{"list"}, args...), " ")
	r := mustSucceed(t, c.run(t, nil, append(append([]string{"etcdbackup", "list"}, args...), "-o", "json")...), what)
	var l struct {
		Items []backupJSON `json:"items"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &l); err != nil {
		t.Fatalf("%s -o json: %v", what, err)
	}
	return l.Items
}

// chainGrowing is the newest backup of target whose chain holds
// segments and has not ended, or "".
func chainGrowing(t *testing.T, c *cluster, target string) string {
	t.Helper()
	for _, b := range listedBackups(t, c, "--target", target) { // newest first
		if ch := b.Status.Chain; ch != nil && ch.Segments > 0 && ch.EndReason == "" {
			return b.Metadata.Name
		}
	}
	return ""
}

type segment struct {
	Name                        string
	Epoch                       int64
	FirstRevision, LastRevision int64
	LastTime                    time.Time
	EndReason                   string
}

// segmentsOf lists full's chain with `list --chain`.
func segmentsOf(t *testing.T, c *cluster, full string) []segment {
	t.Helper()
	items := listedBackups(t, c, "--chain", full)
	var out []segment
	for _, b := range items {
		d := b.Status.Delta
		if d == nil {
			t.Fatalf("list --chain %s lists %s, which is not a delta segment", full, b.Metadata.Name)
		}
		s := segment{Name: b.Metadata.Name, Epoch: d.Epoch, FirstRevision: d.FirstRevision, LastRevision: d.LastRevision, EndReason: d.EndReason}
		if d.LastTime != "" {
			lt, err := time.Parse(time.RFC3339Nano, d.LastTime)
			if err != nil {
				t.Fatalf("segment %s: lastTime %q: %v", b.Metadata.Name, d.LastTime, err)
			}
			s.LastTime = lt
		}
		out = append(out, s)
	}
	return out
}

// checkContiguous fails unless segs follow each other from revision
// from+1 with no gap and no overlap, epochs never going back.
func checkContiguous(t *testing.T, full string, from int64, segs []segment) {
	t.Helper()
	next, epoch := from+1, int64(0)
	for _, s := range segs {
		if s.FirstRevision != next || s.Epoch < epoch {
			t.Fatalf("chain of %s: segment %s holds %d..%d in epoch %d, but the chain had reached %d in epoch %d: a gap or an overlap",
				full, s.Name, s.FirstRevision, s.LastRevision, s.Epoch, next-1, epoch)
		}
		next, epoch = s.LastRevision+1, s.Epoch
	}
	if len(segs) == 0 {
		t.Fatalf("chain of %s holds no segment", full)
	}
}

// restoreToPoint restores target to a point on this machine, as an
// operator would, starts etcd on the result and compares its keyspace
// with the source's at want. It returns what restore printed.
func restoreToPoint(t *testing.T, c *cluster, target string, source *clientv3.Client, flag, value string, want int64) string {
	t.Helper()
	src, err := source.Get(context.Background(), "\x00", clientv3.WithFromKey(), clientv3.WithRev(want))
	if err != nil {
		t.Fatal(err)
	}
	return restoreToPointExpecting(t, c, target, nil, flag, value, want, src.Kvs)
}

// restoreToPointExpecting is restoreToPoint against the keyspace src of
// revision want; the restored etcd is read as auth (nil: etcd's auth is
// off).
func restoreToPointExpecting(t *testing.T, c *cluster, target string, auth *etcdUser, flag, value string, want int64, src []*mvccpb.KeyValue) string {
	t.Helper()
	m := newMembers(t, 1)[0]
	m.name = "r1"
	m.dataDir = filepath.Join(t.TempDir(), "r1.etcd")
	r := mustSucceed(t, c.run(t, nil, "etcdbackup", "restore", "--local", "--target", target, flag, value,
		"--data-dir", m.dataDir, "--member-name", m.name, "--initial-cluster", m.name+"="+m.peerURL.String(),
		"--initial-advertise-peer-urls", m.peerURL.String()), "restore "+flag+" "+value)
	if !strings.Contains(r.Stdout, fmt.Sprintf("as it was at revision %d", want)) {
		t.Fatalf("restore %s %s does not say it restored revision %d:\n%s", flag, value, want, r.Stdout)
	}
	startMembers(t, []*etcdMember{m})
	cfg := etcdClientConfig(m)
	if auth != nil {
		cfg.Username, cfg.Password = auth.name, auth.password
	}
	restored, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer restored.Close()
	got, err := restored.Get(context.Background(), "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	show := func(kv *mvccpb.KeyValue) string {
		return fmt.Sprintf("%s=%.20q create=%d mod=%d version=%d lease=%x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
	}
	if len(got.Kvs) != len(src) {
		t.Errorf("restored %d keys, the source had %d at revision %d", len(got.Kvs), len(src), want)
	}
	bad := 0
	for i := range min(len(got.Kvs), len(src)) {
		if g, w := show(got.Kvs[i]), show(src[i]); g != w && bad < 5 {
			bad++
			t.Errorf("key %d at revision %d:\n restored %s\n source   %s", i, want, g, w)
		}
	}
	t.Logf("restored revision %d: %d keys equal to the source's", want, len(got.Kvs))
	return r.Stdout
}

// etcdUser is an etcd user's name and password.
type etcdUser struct{ name, password string }

// startSecondDeltaAgent copies the running delta agent's pod under a new
// name, still controlled by its Job, without the Job's selector labels.
func startSecondDeltaAgent(ctx context.Context, t *testing.T, c *cluster) string {
	t.Helper()
	return startHandMadeDeltaPod(ctx, t, c, "delta-by-hand", nil)
}

// startHandMadeDeltaPod starts pod name: a copy of the running delta
// agent's pod under its signed Job, outside the Job's selector, with
// change (when set) made to its spec.
func startHandMadeDeltaPod(ctx context.Context, t *testing.T, c *cluster, name string, change func(*corev1.PodSpec)) string {
	t.Helper()
	pods := deltaPods(ctx, t, c)
	if len(pods) == 0 {
		t.Fatal("no delta agent pod to copy")
	}
	p, err := c.sb.Client().CoreV1().Pods(world.DefaultNamespace).Get(ctx, pods[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: p.Namespace, OwnerReferences: p.OwnerReferences,
		// The component's labels (the agent port's NetworkPolicy admits
		// them), not the Job's selector.
		Labels: map[string]string{"app.kubernetes.io/component": "delta-agent", "app.kubernetes.io/managed-by": "etcdbackup-server"},
	}, Spec: *p.Spec.DeepCopy()}
	cp.Spec.NodeName = ""
	if change != nil {
		change(&cp.Spec)
	}
	made, err := c.sb.Client().CoreV1().Pods(world.DefaultNamespace).Create(ctx, cp, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.sb.Client().CoreV1().Pods(world.DefaultNamespace).Delete(context.Background(), made.Name, metav1.DeleteOptions{})
	})
	return made.Name
}

// deltaPods are the delta agent pods that are not being deleted.
func deltaPods(ctx context.Context, t *testing.T, c *cluster) []string {
	t.Helper()
	pods, err := c.sb.Client().CoreV1().Pods(world.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=delta-agent"})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase != "Succeeded" && p.Status.Phase != "Failed" {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

func podRunning(ctx context.Context, t *testing.T, c *cluster, name string) bool {
	p, err := c.sb.Client().CoreV1().Pods(world.DefaultNamespace).Get(ctx, name, metav1.GetOptions{})
	return err == nil && p.Status.Phase == "Running"
}

// deltaJob is the running delta agent Job of live.
func deltaJob(ctx context.Context, t *testing.T, c *cluster) string {
	t.Helper()
	jobs, err := c.sb.Client().BatchV1().Jobs(world.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=delta-agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Items {
		if j.DeletionTimestamp == nil && !jobFinished(&j) {
			return j.Name
		}
	}
	t.Fatal("no running delta agent Job")
	return ""
}

func leaseHolder(ctx context.Context, t *testing.T, c *cluster) string {
	t.Helper()
	l, err := c.sb.Client().CoordinationV1().Leases(world.DefaultNamespace).Get(ctx, "etcdbackup-delta-live", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}
