package main

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

// The Job → agent contract: every kind's Job, as the server builds it,
// parses with the agent's own commands into its kind's flags, and those
// flags write the very same arguments again; over each kind's specs,
// every field of its flags arrives set. A flag renamed, dropped or bound
// to another field on either side fails here, not in a cluster.
func TestJobArgsParseIntoTheirFlags(t *testing.T) {
	ctx := context.Background()
	const ns = "etcdbackup"
	kube := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "age-id"},
		Data:       map[string][]byte{"identity.txt": []byte("AGE-SECRET-KEY-1TEST")},
	})
	l, err := jobs.New(kube, ns, config.Agents{Image: "agent:dev", ServerAddress: "etcdbackup.etcdbackup.svc:50052"})
	if err != nil {
		t.Fatal(err)
	}
	tlsTarget := config.Target{
		Name: "cp", Endpoints: []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379"}, TLSSecret: "etcd-client", InitialClusterToken: "tok",
		Members: []config.Member{{Name: "m1", PeerURL: "https://10.0.0.1:2380", DataDir: "member-1",
			Volume: config.MemberVolume{PersistentVolumeClaim: &config.ClaimRef{ClaimName: "data-m1"}}}},
	}
	kitTarget := config.Target{Name: "cp", Endpoints: tlsTarget.Endpoints, Kit: &config.Kit{
		NodeName: "cp-1", Paths: []string{"/etc/kubernetes", "/etc/encryption"}, AgeRecipients: []string{"age1one", "age1two"},
	}}
	plainTarget := config.Target{Name: "app", Endpoints: []string{"http://etcd:2379"}, InsecurePlaintext: true, Members: tlsTarget.Members}
	sha := strings.Repeat("ab", 32)
	chain := jobs.FoldInputs{Full: jobs.FoldRef{Name: "cp-full", SHA256: sha}, Segments: []jobs.FoldRef{{Name: "cp-full.delta-11", SHA256: sha}}, ToRevision: 20}
	segments := []jobs.SegmentPin{{Name: "b1.delta-11", SHA256: sha}}

	one := func(j *batchv1.Job, err error) []*batchv1.Job {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return []*batchv1.Job{j}
	}
	restores := func(spec jobs.RestoreSpec) []*batchv1.Job {
		t.Helper()
		js, err := l.StartRestore(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	byKind := map[agentjob.Kind][][]*batchv1.Job{
		agentjob.Backup: {
			one(l.StartBackup(ctx, jobs.BackupSpec{Name: "b1", Location: "default", Compression: "zstd", Labels: map[string]string{"team": "a", "env": "prod"},
				Target: tlsTarget, AgeRecipients: []string{"age1one", "age1two"}, Scheduled: true})),
			one(l.StartBackup(ctx, jobs.BackupSpec{Name: "b2", Location: "default", Target: plainTarget})),
		},
		agentjob.Restore: {
			restores(jobs.RestoreSpec{Name: "b1", Location: "default", Target: tlsTarget, MoveAside: true, IdentitySecret: "age-id", SHA256: sha,
				BumpRevision: 1000, ToRevision: 25, Segments: segments, AllowLeaseLoss: true}),
			restores(jobs.RestoreSpec{Name: "b2", Location: "default", Target: tlsTarget, SHA256: sha, BumpRevision: 0,
				ToTime: time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC), ToMinRevision: 21, Segments: segments}),
		},
		agentjob.Drill: {
			one(l.StartDrill(ctx, jobs.DrillSpec{Backup: "b1", Location: "default", Target: "cp", SHA256: sha, IdentitySecret: "age-id", Scheduled: true})),
		},
		agentjob.Delta: {
			one(l.StartDelta(ctx, jobs.DeltaSpec{Target: tlsTarget, Chain: "b1", Location: "default", FromRevision: 10, Compression: "zstd",
				AgeRecipients: []string{"age1one"}, Period: 90 * time.Second, MaxBytes: 1 << 20})),
			one(l.StartDelta(ctx, jobs.DeltaSpec{Target: plainTarget, Chain: "b2", Location: "default", Period: time.Minute, MaxBytes: 1})),
		},
		agentjob.Kit: {
			one(l.StartKit(ctx, jobs.KitSpec{Backup: "b1", Location: "default", Target: kitTarget})),
		},
		agentjob.Fold: {
			one(l.StartFold(ctx, jobs.FoldSpec{Target: tlsTarget, Backup: "cp-fold-20", Location: "default", Inputs: chain, Compression: "zstd",
				AgeRecipients: []string{"age1one"}, IdentitySecret: "age-id"})),
		},
	}
	for _, kind := range agentjob.Kinds {
		runs := byKind[kind.Kind]
		if len(runs) == 0 {
			t.Errorf("kind %s: no Job built; add its specs here", kind.Kind)
			continue
		}
		var parsed []agentjob.Flags
		for _, js := range runs {
			for _, j := range js {
				args := j.Spec.Template.Spec.Containers[0].Args
				var got agentjob.Flags
				root := commands{parsed: func(f agentjob.Flags) { got = f }}.root()
				root.SetArgs(args)
				if err := root.Execute(); err != nil || got == nil {
					t.Fatalf("%s Job %s: the agent does not parse its args %q: %v", kind.Kind, j.Name, args, err)
				}
				if got.Kind() != kind.Kind || j.Labels[agentjob.LabelComponent] != kind.Component {
					t.Errorf("%s Job %s (component %q) runs the %s command", kind.Kind, j.Name, j.Labels[agentjob.LabelComponent], got.Kind())
				}
				if again := got.Args(); !slices.Equal(again, args) {
					t.Errorf("%s Job %s: args\n%q\nparse into flags that write\n%q", kind.Kind, j.Name, args, again)
				}
				parsed = append(parsed, got)
			}
		}
		for _, field := range unsetFields(parsed) {
			t.Errorf("%s: no Job sets %s: the server does not write it, or the agent does not read it", kind.Kind, field)
		}
	}
}

// unsetFields names the fields (embedded structs' by their own name)
// that are zero in every one of flags.
func unsetFields(flags []agentjob.Flags) []string {
	set := map[string]bool{}
	var order []string
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			f, fv := v.Type().Field(i), v.Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(fv)
				continue
			}
			if !slices.Contains(order, f.Name) {
				order = append(order, f.Name)
			}
			switch fv.Kind() {
			case reflect.Slice, reflect.Map:
				set[f.Name] = set[f.Name] || fv.Len() > 0
			default:
				set[f.Name] = set[f.Name] || !fv.IsZero()
			}
		}
	}
	for _, f := range flags {
		walk(reflect.ValueOf(f))
	}
	var unset []string
	for _, name := range order {
		if !set[name] {
			unset = append(unset, name)
		}
	}
	return unset
}
