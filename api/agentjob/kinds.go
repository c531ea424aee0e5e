// Package agentjob is the contract between the data server and the agents
// it runs as Kubernetes Jobs, shared by both sides of that boundary: the
// kinds of agent (Kinds, one row each: labels, Job names, where a kind
// runs, what it may do through the agent port, how it is retried), the
// flags each kind's Job passes to its agent (BackupFlags … FoldFlags,
// written by Args, parsed by cmd/etcdbackup-agent into the same
// structs), and what an agent reports back in its termination message
// (DrillVerdict, FoldVerdict, DeltaEnd). It imports only the standard
// library, so the agent binary and the server both link it.
//
// A new kind of agent is one row in Kinds, one flags struct here, one
// agents/ package, one subcommand of cmd/etcdbackup-agent and one Job
// builder in server/jobs (docs/design.md, "Adding an agent kind").
package agentjob

import "strings"

// Kind names a kind of agent: the agent's subcommand, the start of its
// Jobs' names, and what the Job signature calls it.
type Kind string

// The kinds of agent.
const (
	Backup  Kind = "backup"
	Restore Kind = "restore"
	Drill   Kind = "drill"
	Delta   Kind = "delta"
	Fold    Kind = "fold"
	Kit     Kind = "kit"
)

// Labels every agent Job and its pod template carry.
const (
	// LabelComponent holds the kind's Spec.Component.
	LabelComponent = "app.kubernetes.io/component"
	// LabelManagedBy holds ManagedBy on every agent Job the server
	// creates: its informers select them, and the agent guard admits only
	// pods of such Jobs.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "etcdbackup-server"
)

// Spec is one kind of agent: everything the server, its guard and its
// caches know of a kind, in one row of Kinds.
type Spec struct {
	Kind Kind
	// Component is the kind's LabelComponent value.
	Component string
	// InRestoreNamespace Jobs run in the namespace the restores of their
	// target run in (beside the members' volumes); the others in the
	// server's own.
	InRestoreNamespace bool
	// Uploads: the agent stores through the agent port (each kind only
	// what its Job names: a backup, a chain's segments, a folded full).
	Uploads bool
	// Downloads: the agent reads through the agent port what its Job
	// pins to a SHA-256.
	Downloads bool
	// DeltaWriter: the agent holds its target's delta Lease through the
	// server.
	DeltaWriter bool
	// ReadsRecord: the agent reads its own backup's record (GetBackup): a
	// delta agent where its chain stands, a kit agent whether the backup
	// it goes with is stored.
	ReadsRecord bool
	// ReadsHost: the agent reads directories of the node its target names
	// (hostPath volumes, read-only), as root with no capability but
	// CAP_DAC_READ_SEARCH; such a kind is InRestoreNamespace, the one
	// namespace whose Pod Security admits it.
	ReadsHost bool
	// PinsBackup: the Job names the stored SHA-256 of the backup it reads
	// (annotation etcdbackup.io/sha256); one without is refused.
	PinsBackup bool
	// AnyBackup: the Job may be about a backup of no configured target
	// (a drill of an uploaded backup); every other kind's target must be
	// one the server has.
	AnyBackup bool
	// RetriedWhenDisrupted: a pod Kubernetes disrupted (drained,
	// preempted, its node gone) is replaced and the agent starts again;
	// any other failure ends the Job. Only agents that read etcd or a
	// backup and store nothing half-done.
	RetriedWhenDisrupted bool
	// Restarts, above 0, makes a long-running agent: no deadline, and a
	// crashed container is restarted in its pod up to Restarts times. 0
	// is one attempt within the configured deadline.
	Restarts int32
	// Reports: the agent writes a JSON termination message (its verdict
	// or its chain's end) for the server to read; the others' is the end
	// of their log.
	Reports bool
	// Supervised: the server's controller starts the kind again by
	// itself; the others are started by a user or a schedule.
	Supervised bool
}

// Kinds is every kind of agent, one row each.
var Kinds = []Spec{
	{Kind: Backup, Component: "backup-agent", Uploads: true, RetriedWhenDisrupted: true},
	{Kind: Restore, Component: "restore-agent", InRestoreNamespace: true, Downloads: true, PinsBackup: true},
	{Kind: Drill, Component: "drill-agent", Downloads: true, PinsBackup: true, AnyBackup: true, RetriedWhenDisrupted: true, Reports: true},
	{Kind: Delta, Component: "delta-agent", Uploads: true, DeltaWriter: true, ReadsRecord: true, Restarts: 6, Reports: true, Supervised: true},
	{Kind: Fold, Component: "fold-agent", Uploads: true, Downloads: true, Reports: true, Supervised: true},
	{Kind: Kit, Component: "kit-agent", InRestoreNamespace: true, ReadsHost: true, Uploads: true, ReadsRecord: true, RetriedWhenDisrupted: true},
}

// Of is kind k's row; the zero Spec for a kind that is none.
func Of(k Kind) Spec {
	for _, s := range Kinds {
		if s.Kind == k {
			return s
		}
	}
	return Spec{}
}

// OfComponent is the row whose Component is c (a Job's LabelComponent);
// false for a value no kind has.
func OfComponent(c string) (Spec, bool) {
	for _, s := range Kinds {
		if s.Component == c {
			return s, true
		}
	}
	return Spec{}, false
}

// Labels are the labels of k's Jobs and their pods that say what they
// are; a Job adds its run's own.
func (k Kind) Labels() map[string]string {
	return map[string]string{LabelComponent: Of(k).Component, LabelManagedBy: ManagedBy}
}

// JobName is the name of one of k's Jobs from a readable hint and the
// run's ID (hex, at least 10 digits): Job names are DNS labels of at
// most 63 characters, backup names may be 200 and member names are
// whatever etcd accepts. The hint is cut to 30 characters and what a DNS
// label cannot hold becomes a dash.
func (k Kind) JobName(hint, id string) string {
	if len(hint) > 30 {
		hint = hint[:30]
	}
	hint = strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, hint), "-")
	return string(k) + "-" + hint + "-" + id[:10]
}

// The Secrets of the server's namespace its trust rests on. Every backup
// of the cluster the server runs in holds them, so a restore of that
// cluster removes them (snapshot.RevokeServerKeys) and the server makes
// new ones.
const (
	// SigningKeySecret holds the key that signs agent Jobs
	// (server/jobs.Signer).
	SigningKeySecret = "etcdbackup-job-signing-key"
	// AgentCASecret holds the CA of the agent port's certificate
	// (server/agenttls).
	AgentCASecret = "etcdbackup-agent-ca"
)
