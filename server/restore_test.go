package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// closedURL is a client URL where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// silentURL accepts connections and closes them at once, as a Service
// without endpoints may.
func silentURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return "http://" + l.Addr().String()
}

type restoreWorld struct {
	srv    *server.Server
	client *fake.Clientset
	loc    storage.Location
	agents *jobs.Launcher
	// sha256 is backup b1's.
	sha256 string
}

// synced waits until the server's agent caches hold what the test
// changed through the fake clientset.
func (w *restoreWorld) synced(t *testing.T) {
	t.Helper()
	if err := w.agents.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func newRestoreWorld(t *testing.T, clientURLs ...string) *restoreWorld {
	t.Helper()
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	up, err := loc.Create(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("not really a snapshot")
	if _, err := up.Write(data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if err := up.Commit(ctx, &storage.Manifest{Name: "b1", Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	target := config.Target{Name: "app", Endpoints: []string{closedURL(t)}, InsecurePlaintext: true, Namespace: "app", InitialClusterToken: "tok"}
	for i, u := range clientURLs {
		name := "m" + string(rune('0'+i))
		target.Members = append(target.Members, config.Member{
			Name: name, PeerURL: "http://" + name + ".app.svc:2380", ClientURL: u, DataDir: "data",
			Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-" + name}},
		})
	}
	if err := l.Start(t.Context(), []config.Target{target}); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Locations: []server.NamedLocation{{Name: "default", Location: loc}},
		Targets:   []config.Target{target},
		Agents:    l,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &restoreWorld{srv: srv, client: cs, loc: loc, agents: l, sha256: hex.EncodeToString(sum[:])}
}

func (w *restoreWorld) jobs(t *testing.T) []batchv1.Job {
	t.Helper()
	list, err := w.client.BatchV1().Jobs("app").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func TestRestoreRefusedWhileAMemberAnswers(t *testing.T) {
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"etcdserver":"3.7.3"}`)) }))
	defer live.Close()
	w := newRestoreWorld(t, closedURL(t), live.URL, silentURL(t))
	_, err := w.srv.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore while m1 answers: %v, want FailedPrecondition", err)
	}
	msg := status.Convert(err).Message()
	for _, want := range []string{"m1 (" + live.URL + ")", "scale statefulset", "/etc/kubernetes/manifests"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "m0") || strings.Contains(msg, "m2") {
		t.Errorf("refusal names stopped members: %q", msg)
	}
	if j := w.jobs(t); len(j) != 0 {
		t.Fatalf("a refused restore created %d jobs", len(j))
	}

	// A dry run shows the plan, marks the running member, creates nothing.
	resp, err := w.srv.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetMembers()) != 3 || !strings.Contains(resp.GetMembers()[1].GetMessage(), "still answers") || resp.GetMembers()[0].GetMessage() != "" {
		t.Fatalf("dry run plan: %v", resp)
	}
	if j := w.jobs(t); len(j) != 0 {
		t.Fatalf("a dry run created %d jobs", len(j))
	}
}

func TestRestoreStartsOneJobPerMember(t *testing.T) {
	w := newRestoreWorld(t, closedURL(t), silentURL(t))
	ctx := context.Background()
	resp, err := w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", MoveAside: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetMembers()) != 2 {
		t.Fatalf("plan: %v", resp)
	}
	// No bump_revision in the request: etcd's recommendation.
	for _, m := range resp.GetMembers() {
		if m.GetBumpRevision() != 1_000_000_000 || !m.GetMarkCompacted() {
			t.Errorf("member %s: bump %d, mark compacted %v; want 1000000000 and marked", m.GetMember(), m.GetBumpRevision(), m.GetMarkCompacted())
		}
	}
	list := w.jobs(t)
	if len(list) != 2 {
		t.Fatalf("%d jobs, want 2", len(list))
	}
	for _, j := range list {
		spec := j.Spec.Template.Spec
		if spec.ServiceAccountName != "etcdbackup-agent" || *spec.AutomountServiceAccountToken {
			t.Errorf("job %s: service account %q, token %v", j.Name, spec.ServiceAccountName, *spec.AutomountServiceAccountToken)
		}
		args := strings.Join(spec.Containers[0].Args, " ")
		for _, want := range []string{
			"--initial-cluster=m0=http://m0.app.svc:2380,m1=http://m1.app.svc:2380", "--initial-cluster-token=tok",
			"--data-dir=/var/lib/etcd-restore/data", "--move-aside", "--server=etcdbackup.etcdbackup-system.svc:" + config.DefaultAgentPort,
			// Pinned to the stored backup's content, authenticated by its own token.
			"--sha256=" + w.sha256, "--token-file=" + jobs.TokenPath,
			"--bump-revision=1000000000",
		} {
			if !strings.Contains(args, want) {
				t.Errorf("job %s args %q lack %q", j.Name, args, want)
			}
		}
		if j.Annotations[jobs.AnnotationSHA256] != w.sha256 || j.Spec.Template.Annotations[jobs.AnnotationSHA256] != w.sha256 {
			t.Errorf("job %s: SHA-256 annotations %q (job) and %q (pod), want %s", j.Name,
				j.Annotations[jobs.AnnotationSHA256], j.Spec.Template.Annotations[jobs.AnnotationSHA256], w.sha256)
		}
		if spec.Volumes[0].PersistentVolumeClaim == nil || !strings.HasPrefix(spec.Volumes[0].PersistentVolumeClaim.ClaimName, "data-m") {
			t.Errorf("job %s does not mount the member's claim: %+v", j.Name, spec.Volumes[0])
		}
	}

	// Running: a second restore is refused; GetRestore follows the Jobs.
	if _, err := w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("second restore while running: %v", err)
	}
	get := func() []*ebv1.MemberRestore {
		r, err := w.srv.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetMembers()
	}
	for _, m := range get() {
		if m.GetPhase() != ebv1.RestorePhase_RESTORE_PHASE_RUNNING {
			t.Fatalf("member %s: %v, want running", m.GetMember(), m.GetPhase())
		}
		if m.GetBumpRevision() != 1_000_000_000 || !m.GetMarkCompacted() {
			t.Errorf("GetRestore of member %s: bump %d, mark compacted %v; want what its Job was started with", m.GetMember(), m.GetBumpRevision(), m.GetMarkCompacted())
		}
	}
	for i, j := range list {
		cond := batchv1.JobComplete
		if i == 1 {
			cond = batchv1.JobFailed
		}
		j.Status.Conditions = []batchv1.JobCondition{{Type: cond, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}}
		if _, err := w.client.BatchV1().Jobs("app").UpdateStatus(ctx, &j, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.synced(t)
	phases := map[string]ebv1.RestorePhase{}
	for _, m := range get() {
		phases[m.GetMember()] = m.GetPhase()
	}
	if len(phases) != 2 || phases["m0"] == phases["m1"] {
		t.Fatalf("phases after the jobs ended: %v", phases)
	}
}

// bump_revision reaches every member's Job and comes back from
// GetRestore; 0 turns the bump and the mark off; negative is refused
// before anything is created.
func TestRestoreBumpRevision(t *testing.T) {
	w := newRestoreWorld(t, closedURL(t), closedURL(t))
	ctx := context.Background()
	bump := func(b *ebv1.MemberRestore) string {
		return b.GetMember() + ":" + strconv.FormatInt(b.GetBumpRevision(), 10) + ":" + strconv.FormatBool(b.GetMarkCompacted())
	}

	_, err := w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", BumpRevision: proto.Int64(-1)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "--bump-revision -1 is negative") {
		t.Fatalf("negative bump: %v, want InvalidArgument naming --bump-revision", err)
	}
	if j := w.jobs(t); len(j) != 0 {
		t.Fatalf("a refused restore created %d jobs", len(j))
	}

	// The dry run's plan says what each member would get.
	plan, err := w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", DryRun: true, BumpRevision: proto.Int64(42)})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range plan.GetMembers() {
		if got := bump(m); got != m.GetMember()+":42:true" {
			t.Errorf("dry run plan: %s", got)
		}
	}

	resp, err := w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "b1", Target: "app", BumpRevision: proto.Int64(0)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.srv.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ms := range [][]*ebv1.MemberRestore{resp.GetMembers(), got.GetMembers()} {
		if len(ms) != 2 || bump(ms[0]) != "m0:0:false" || bump(ms[1]) != "m1:0:false" {
			t.Errorf("members %v, want no bump and no mark", ms)
		}
	}
	for _, j := range w.jobs(t) {
		if args := j.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--bump-revision=0") || j.Annotations[jobs.AnnotationBumpRevision] != "0" {
			t.Errorf("job %s: args %q, annotations %v; want --bump-revision=0", j.Name, args, j.Annotations)
		}
	}
}

func TestRestoreRequestErrors(t *testing.T) {
	w := newRestoreWorld(t, closedURL(t))
	ctx := context.Background()
	for _, tc := range []struct {
		req  *ebv1.RestoreBackupRequest
		code codes.Code
	}{
		{&ebv1.RestoreBackupRequest{Name: "b1"}, codes.InvalidArgument},
		{&ebv1.RestoreBackupRequest{Name: "b1", Target: "nope"}, codes.NotFound},
		{&ebv1.RestoreBackupRequest{Name: "missing", Target: "app"}, codes.NotFound},
		{&ebv1.RestoreBackupRequest{Name: "../x", Target: "app"}, codes.InvalidArgument},
	} {
		if _, err := w.srv.RestoreBackup(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("%v: %v, want %v", tc.req, err, tc.code)
		}
	}
	if _, err := w.srv.GetRestore(ctx, &ebv1.GetRestoreRequest{Name: "b1", Target: "app"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetRestore of a restore never started: %v", err)
	}
}

func TestTargetMembersAreValidated(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pvc := config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "c"}}
	host := config.MemberVolume{HostPath: &config.HostPathRef{Path: "/var/lib/etcd"}}
	for _, m := range []config.Member{
		{Name: "a", PeerURL: "etcd-0:2380", Volume: pvc},
		{Name: "a", PeerURL: "http://a:2380", DataDir: "../x", Volume: pvc},
		{Name: "a", PeerURL: "http://a:2380", DataDir: "/abs", Volume: pvc},
		{Name: "a", PeerURL: "http://a:2380"},
		{Name: "a", PeerURL: "http://a:2380", Volume: host},
		{Name: "a", PeerURL: "http://a:2380", Volume: config.MemberVolume{PersistentVolumeClaim: pvc.PersistentVolumeClaim, HostPath: host.HostPath}, NodeName: "n"},
	} {
		_, err := server.New(server.Config{
			Locations: []server.NamedLocation{{Name: "default", Location: loc}},
			Targets:   []config.Target{{Name: "t", Endpoints: []string{"http://a:2379"}, Members: []config.Member{m}}},
		})
		if err == nil {
			t.Errorf("member %+v accepted", m)
		} else if !strings.Contains(err.Error(), "targets[0].members[0].") {
			t.Errorf("member %+v: error %q does not name the field", m, err)
		}
	}
}

func TestRestoreProbeSeesTLSMembers(t *testing.T) {
	live := httptest.NewUnstartedServer(http.NotFoundHandler())
	live.TLS = nil
	live.StartTLS()
	defer live.Close()
	w := newRestoreWorld(t, live.URL)
	if !strings.HasPrefix(live.URL, "https://") {
		t.Fatalf("not a TLS URL: %s", live.URL)
	}
	_, err := w.srv.RestoreBackup(context.Background(), &ebv1.RestoreBackupRequest{Name: "b1", Target: "app"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("restore while a TLS member answers: %v", err)
	}
}

// TestNewChecksTargets: server.New refuses what the config file would,
// naming the field, for servers built without config.Load.
func TestNewChecksTargets(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ok := config.Target{Name: "t", Endpoints: []string{"http://a:2379"}}
	with := func(edit func(*config.Target)) config.Target {
		c := ok
		edit(&c)
		return c
	}
	for _, tc := range []struct {
		name      string
		locations []string
		targets   []config.Target
		want      string
	}{
		{"duplicate location", []string{"default", "default"}, nil, `locations[1].name: Duplicate value: "default"`},
		{"location name", []string{"Default"}, nil, `locations[0].name: Invalid value: "Default"`},
		{"duplicate target", []string{"default"}, []config.Target{ok, ok}, `targets[1].name: Duplicate value: "t"`},
		{"no endpoints", []string{"default"}, []config.Target{with(func(c *config.Target) { c.Endpoints = nil })}, "targets[0].endpoints: Required value"},
		{"unknown location", []string{"default"}, []config.Target{with(func(c *config.Target) { c.Location = "s3" })}, `targets[0].location: Not found: "s3"`},
		{"compression", []string{"default"}, []config.Target{with(func(c *config.Target) { c.Compression = "gzip" })}, `targets[0].compression: Unsupported value: "gzip"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var locs []server.NamedLocation
			for _, n := range tc.locations {
				locs = append(locs, server.NamedLocation{Name: n, Location: loc})
			}
			_, err := server.New(server.Config{Locations: locs, Targets: tc.targets})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCreateBackupUsesTargetDefaults: a request naming no location or
// compression gets the target's, and the Job carries them.
func TestCreateBackupUsesTargetDefaults(t *testing.T) {
	ctx := context.Background()
	var locs []server.NamedLocation
	for _, n := range []string{"default", "s3"} {
		loc, err := filesystem.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, server.NamedLocation{Name: n, Location: loc})
	}
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{
		Locations: locs,
		Targets: []config.Target{
			{Name: "cp", Endpoints: []string{"https://etcd:2379"}, TLSSecret: "etcd-client", Location: "s3", Compression: "zstd"},
			// As the CLI and the manifests spell it.
			{Name: "cp-none", Endpoints: []string{"https://etcd:2379"}, TLSSecret: "etcd-client", Compression: "none"},
		},
		Agents: l,
		Now:    func() time.Time { return time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "etcdbackup-system/etcd-client does not exist") {
		t.Fatalf("without the TLS Secret: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("etcdbackup-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "etcd-client"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b := resp.GetBackup()
	if b.GetName() != "cp-20260131-120000" || b.GetLocation() != "s3" || b.GetCompression() != "zstd" || b.GetSource().GetTarget() != "cp" {
		t.Fatalf("backup %+v", b)
	}
	resp, err = srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "plain", Location: "default", Compression: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.GetBackup(); b.GetLocation() != "default" || b.GetCompression() != "" {
		t.Fatalf("backup %+v", b)
	}
	resp, err = srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "target-none", Target: "cp-none"})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.GetBackup(); b.GetCompression() != "" {
		t.Fatalf("backup of a target with compression: none: %+v", b)
	}
	list, err := cs.BatchV1().Jobs("etcdbackup-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	for _, j := range list.Items {
		args[j.Annotations[jobs.AnnotationBackup]] = strings.Join(j.Spec.Template.Spec.Containers[0].Args, " ")
	}
	if a := args["cp-20260131-120000"]; !strings.Contains(a, "--location=s3") || !strings.Contains(a, "--compression=zstd") {
		t.Errorf("job args %q", a)
	}
	for _, name := range []string{"plain", "target-none"} {
		if a := args[name]; !strings.Contains(a, "--location=default") || strings.Contains(a, "--compression") {
			t.Errorf("job args of %s: %q", name, a)
		}
	}
}

// An encrypted backup is restored only with an identity Secret, which the
// Jobs mount; the request without one says how to make it.
func TestRestoreOfEncryptedBackupNeedsIdentitySecret(t *testing.T) {
	w := newRestoreWorld(t, closedURL(t))
	ctx := context.Background()
	up, err := w.loc.Create(ctx, "enc")
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("age-encryption.org/v1\n")
	up.Write(data)
	sum := sha256.Sum256(data)
	if err := up.Commit(ctx, &storage.Manifest{Name: "enc", Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Encryption: "age",
		AgeRecipients: []string{"age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"}}); err != nil {
		t.Fatal(err)
	}
	_, err = w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "enc", Target: "app"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--identity-secret") || !strings.Contains(err.Error(), `namespace "app"`) {
		t.Fatalf("without identity Secret: %v", err)
	}
	if len(w.jobs(t)) != 0 {
		t.Fatal("jobs created")
	}
	if _, err := w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "enc", Target: "app", IdentitySecret: "Bad_Name"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad Secret name: %v", err)
	}
	if _, err := w.srv.RestoreBackup(ctx, &ebv1.RestoreBackupRequest{Name: "enc", Target: "app", IdentitySecret: "etcd-age-key"}); err != nil {
		t.Fatal(err)
	}
	for _, j := range w.jobs(t) {
		spec := j.Spec.Template.Spec
		mounted := false
		for _, v := range spec.Volumes {
			mounted = mounted || (v.Secret != nil && v.Secret.SecretName == "etcd-age-key")
		}
		if !mounted || !strings.Contains(strings.Join(spec.Containers[0].Args, " "), "--identity-dir=") {
			t.Errorf("job %s: identity Secret mounted %v, args %v", j.Name, mounted, spec.Containers[0].Args)
		}
	}
}

// A target with encryption hands its public keys to the backup Job, and
// the running backup says it will be encrypted.
func TestCreateBackupOfAnEncryptedTarget(t *testing.T) {
	ctx := context.Background()
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	l, err := jobs.New(cs, "etcdbackup-system", config.Agents{Image: "agent:dev"})
	if err != nil {
		t.Fatal(err)
	}
	const rcp = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
	srv, err := server.New(server.Config{
		Locations: []server.NamedLocation{{Name: "default", Location: loc}},
		Targets:   []config.Target{{Name: "cp", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true, Encryption: &config.Encryption{AgeRecipients: []string{rcp}}}},
		Agents:    l,
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.CreateBackup(ctx, &ebv1.CreateBackupRequest{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.GetBackup(); b.GetEncryption() != "age" || len(b.GetAgeRecipients()) != 1 {
		t.Fatalf("backup %v", b)
	}
	list, err := cs.BatchV1().Jobs("etcdbackup-system").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("%v %v", list, err)
	}
	if args := strings.Join(list.Items[0].Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--encrypt-to="+rcp) {
		t.Fatalf("args %s", args)
	}
}
