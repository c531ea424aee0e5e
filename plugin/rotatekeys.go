package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// RotateKeysOptions are the options of `kubectl etcdbackup rotate-keys`.
type RotateKeysOptions struct {
	*GlobalOptions
	// Force rotates even while agent Jobs run (they are then refused).
	Force   bool
	DryRun  bool
	Timeout time.Duration
}

// serverKeys are the Secrets rotate-keys replaces: every backup of the
// cluster the server runs in holds them.
var serverKeys = []string{agentjob.SigningKeySecret, agentjob.AgentCASecret}

// NewCmdRotateKeys returns the rotate-keys command.
func NewCmdRotateKeys(g *GlobalOptions) *cobra.Command {
	o := &RotateKeysOptions{GlobalOptions: g, Timeout: 2 * time.Minute}
	cmd := &cobra.Command{
		Use:   "rotate-keys",
		Short: "Replace the data server's own keys: the key that signs agent Jobs and the agent port's CA",
		Long: `rotate-keys replaces the two keys the data server's trust in its agents rests
on, which every backup of the cluster it runs in holds: Secret
` + agentjob.SigningKeySecret + ` (the key that signs agent Jobs) and Secret
` + agentjob.AgentCASecret + ` (the CA of the agent port's certificate), in the
server's namespace. It deletes both and waits until the server has made new
ones (it looks every 30 s): from then on, agent Jobs signed with the old key
are refused and agents started before cannot connect. A restore of the
cluster removes them by itself; run this after a backup leaked
(docs/disaster-recovery.md, "What a backup exposes, and what to rotate").

It refuses while agent Jobs other than delta agents run (they would fail):
wait for them, or pass --force. Your kubeconfig user needs get and delete on
these two Secrets, and list on Jobs, in the server's namespace.`,
		Example: examples(`
# Replace the server's keys, once no backup, restore or drill runs
kubectl etcdbackup rotate-keys

# Say what would be done
kubectl etcdbackup rotate-keys --dry-run`),
		Args: cobra.NoArgs,
		RunE: runE(o),
	}
	cmd.Flags().BoolVar(&o.Force, "force", false, "rotate even while agent Jobs run; they are refused from then on")
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "say what would be replaced, change nothing")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", o.Timeout, "how long to wait for the server to make the new keys")
	return cmd
}

// Complete has nothing to complete.
func (o *RotateKeysOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the flags.
func (o *RotateKeysOptions) Validate() error {
	if o.Timeout <= 0 {
		return fmt.Errorf("--timeout %s: give a positive duration", o.Timeout)
	}
	if o.StorageConfig != "" || o.ServerAddress != "" {
		return errors.New("rotate-keys works through the API server: drop --storage-config and --server-address")
	}
	return nil
}

// Run rotates the keys.
func (o *RotateKeysOptions) Run(ctx context.Context) error {
	cfg, err := o.ConfigFlags.ToRESTConfig()
	if err != nil {
		return fmt.Errorf("rotate-keys: load kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ns := o.namespace()
	old := map[string]types.UID{}
	for _, name := range serverKeys {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			// Removed already (a restore of this cluster does): the
			// server makes it anew; wait for that.
			old[name] = ""
		case err != nil:
			return o.kubeErr(ns, "get secret "+name, err)
		default:
			old[name] = s.UID
		}
	}
	running, err := runningAgents(ctx, cs, ns)
	if err != nil {
		return o.kubeErr(ns, "list jobs", err)
	}
	if len(running) > 0 && !o.Force {
		return withCode(ExitRefused, fmt.Errorf("rotate-keys refused, nothing was changed: agent Jobs run in %s (%s), and would be refused once the keys change; wait until they finish (kubectl -n %s get jobs), or pass --force",
			ns, strings.Join(running, ", "), ns))
	}
	if o.DryRun {
		fmt.Fprintf(o.Out, "would delete Secrets %s in %s and wait for the server to make new ones\n", strings.Join(serverKeys, " and "), ns)
		return nil
	}
	for _, name := range serverKeys {
		uid := old[name]
		if uid == "" {
			continue
		}
		err := cs.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) {
			return o.kubeErr(ns, "delete secret "+name, err)
		}
	}
	fmt.Fprintf(o.ErrOut, "deleted Secrets %s in %s; waiting for the server to make new ones (it looks every 30 s)\n", strings.Join(serverKeys, " and "), ns)
	err = wait.PollUntilContextTimeout(ctx, time.Second, o.Timeout, true, func(ctx context.Context) (bool, error) {
		for _, name := range serverKeys {
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || s.UID == old[name] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return withCode(ExitFailed, fmt.Errorf("rotate-keys: the old keys were deleted, but the server made no new ones within %s: is it running (kubectl -n %s get pods)? It makes them when it starts, and every 30 s while it runs", o.Timeout, ns))
	}
	fmt.Fprintf(o.Out, "rotated the data server's Job-signing key and agent CA in %s: agent Jobs signed before are refused, agents started before cannot connect; the keys a backup holds no longer work\n", ns)
	return nil
}

// runningAgents names the agent Jobs of the server in ns that have not
// finished, delta agents aside (long-running; the server starts them
// again).
func runningAgents(ctx context.Context, cs kubernetes.Interface, ns string) ([]string, error) {
	jobs, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: agentjob.LabelManagedBy + "=" + agentjob.ManagedBy})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, j := range jobs.Items {
		if j.Labels[agentjob.LabelComponent] == agentjob.Of(agentjob.Delta).Component || finished(&j) {
			continue
		}
		out = append(out, j.Name)
	}
	slices.Sort(out)
	return out, nil
}

func finished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// kubeErr says what RBAC a refused call needs.
func (o *RotateKeysOptions) kubeErr(ns, what string, err error) error {
	if apierrors.IsForbidden(err) {
		return withCode(ExitRefused, fmt.Errorf("rotate-keys: %s in %s: %v; rotate-keys needs get and delete on secrets %s, and list on jobs, in %s", what, ns, err, strings.Join(serverKeys, ", "), ns))
	}
	if apierrors.IsNotFound(err) {
		return withCode(ExitRefused, fmt.Errorf("rotate-keys: %s in %s: %v; is the server installed in %s (-n)?", what, ns, err, ns))
	}
	return fmt.Errorf("rotate-keys: %s in %s: %w", what, ns, err)
}
