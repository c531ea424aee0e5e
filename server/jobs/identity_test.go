package jobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/jobs"
)

const fakeAgeIdentity = "# created: 2026-12-01\nAGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ\n"

func putSecret(t *testing.T, cs *fake.Clientset, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func mustSay(t *testing.T, err error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one saying %q", words)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

// The identity Secret of a drill or fold is checked before its Job is
// created: missing, or holding no age identity, it is a configuration
// error (ErrIdentitySecret) that says what to create.
func TestCheckIdentitySecret(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	err := l.CheckIdentitySecret(ctx, "drill-key", "drill")
	if !errors.Is(err, jobs.ErrIdentitySecret) {
		t.Fatalf("missing Secret: %v; want ErrIdentitySecret", err)
	}
	mustSay(t, err, ns+"/drill-key does not exist", "create secret generic drill-key", "drill.identitySecret")

	putSecret(t, cs, "wrong-key", map[string]string{"password": "hunter2", ".hidden": fakeAgeIdentity})
	err = l.CheckIdentitySecret(ctx, "wrong-key", "deltas")
	if !errors.Is(err, jobs.ErrIdentitySecret) {
		t.Fatalf("Secret without an identity: %v; want ErrIdentitySecret", err)
	}
	mustSay(t, err, "deltas identity Secret", "holds no age identity", "keys read: password", "AGE-SECRET-KEY-1")
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the error shows the Secret's value: %v", err)
	}

	putSecret(t, cs, "good-key", map[string]string{"identity.txt": fakeAgeIdentity})
	if err := l.CheckIdentitySecret(ctx, "good-key", "drill"); err != nil {
		t.Fatal(err)
	}
}

// A drill of an encrypted target with a missing identity Secret starts no
// Job; with one, the Job mounts it as an optional volume, so that a
// Secret deleted later leaves the agent to report it rather than the
// pod waiting in ContainerCreating. Fold Jobs mount theirs the same way.
func TestIdentitySecretLaunchAndOptionalVolume(t *testing.T) {
	l, cs := newLauncher(t, config.Agents{})
	ctx := context.Background()
	spec := jobs.DrillSpec{Backup: "b1", Location: "default", Target: target.Name, SHA256: strings.Repeat("a", 64), IdentitySecret: "drill-key"}
	if _, err := l.StartDrill(ctx, spec); !errors.Is(err, jobs.ErrIdentitySecret) {
		t.Fatalf("drill with a missing identity Secret: %v; want ErrIdentitySecret", err)
	}
	if list, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Fatalf("jobs after a refused drill: %v, %v", list, err)
	}
	putSecret(t, cs, "drill-key", map[string]string{"identity.txt": fakeAgeIdentity})
	putSecret(t, cs, "fold-key", map[string]string{"key": fakeAgeIdentity})
	d, err := l.StartDrill(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.StartFold(ctx, jobs.FoldSpec{Target: target, Backup: jobs.FoldName(target.Name, 5000), Location: "default",
		Inputs: foldInputs(3), IdentitySecret: "fold-key"})
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]struct {
		pod    corev1.PodSpec
		secret string
	}{"drill": {d.Spec.Template.Spec, "drill-key"}, "fold": {f.Spec.Template.Spec, "fold-key"}} {
		var found bool
		for _, v := range want.pod.Volumes {
			if s := v.Secret; s != nil && s.SecretName == want.secret {
				found = true
				if s.Optional == nil || !*s.Optional {
					t.Errorf("%s job: identity volume %q is not optional", kind, v.Name)
				}
			}
		}
		if !found {
			t.Errorf("%s job mounts no Secret %s: %+v", kind, want.secret, want.pod.Volumes)
		}
		if !strings.Contains(strings.Join(want.pod.Containers[0].Args, " "), "--identity-dir=") {
			t.Errorf("%s job args lack --identity-dir: %q", kind, want.pod.Containers[0].Args)
		}
	}
}
