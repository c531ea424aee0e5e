// Package drill proves that a backup restores: it fetches the backup pinned
// to its SHA-256 through the data server (as a restore agent does, with
// the same checks), rebuilds a member's data in scratch space with etcd's
// own restore code, starts an etcd on loopback from it, and compares the
// revision, the number of keys and etcd's HashKV that member answers with
// the keyspace fingerprint the backup's manifest recorded — for an agent
// backup, what the live cluster answered at that revision.
package drill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"filippo.io/age"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/restore"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
)

// Options say which backup to drill and where to work.
type Options struct {
	Name, Location string
	// SHA256 is the stored SHA-256 the backup must have: the drill checks
	// the backup the server asked about, not whatever is stored under
	// the name now.
	SHA256 string
	// Identities decrypt an encrypted backup.
	Identities []age.Identity
	// IdentityProblem says why the identities the drill was meant to
	// have could not be read (the identity Secret does not exist, so its
	// optional volume is empty, or it holds no age identity); "" when
	// there was none to read or they were read. An encrypted backup then
	// gets no verdict, with this in the message.
	IdentityProblem string
	// ScratchDir holds the download, the restored member and nothing
	// else; it is emptied when the drill ends.
	ScratchDir string
	// StartTimeout bounds how long the restored member may take to serve.
	StartTimeout time.Duration
}

// Result is a drill's finding, as the server records it in the backup's
// manifest (status.verification).
type Result struct {
	// Succeeded is true when the restored member answered and every
	// recorded fact matched.
	Succeeded bool `json:"succeeded"`
	// NoVerdict is true when the drill learned nothing about the backup
	// (it could not be decrypted here, the server did not serve it):
	// Message says what to do.
	NoVerdict bool `json:"noVerdict,omitempty"`
	// Revision, Keys and HashKV are what the restored member answered
	// (zero when it was not reached).
	Revision int64  `json:"revision"`
	Keys     int64  `json:"keys"`
	HashKV   uint32 `json:"hashKV"`
	// Message says what was compared, or why the drill failed and what
	// that means.
	Message string `json:"message"`
	// Duration is the drill's wall time, download included.
	Duration time.Duration `json:"duration"`
}

// Run drills one backup. It returns an error only when the drill could
// not reach a verdict about the backup (the server did not answer, the
// scratch space is unusable); a backup that does not restore, or restores
// to something other than what was recorded, is a Result with Succeeded
// false and a message that says why.
func Run(ctx context.Context, c *client.Client, o Options) (Result, error) {
	start := time.Now()
	res, err := run(ctx, c, o)
	res.Duration = time.Since(start)
	return res, err
}

func run(ctx context.Context, c *client.Client, o Options) (Result, error) {
	if o.ScratchDir == "" {
		return Result{}, errors.New("drill: no scratch directory")
	}
	work, err := os.MkdirTemp(o.ScratchDir, "drill-")
	if err != nil {
		return Result{}, fmt.Errorf("drill: scratch space: %w", err)
	}
	defer os.RemoveAll(work)

	download := filepath.Join(work, "download")
	if err := os.Mkdir(download, 0o700); err != nil {
		return Result{}, fmt.Errorf("drill: scratch space: %w", err)
	}
	path, v, err := restore.Fetch(ctx, c, restore.FetchRequest{
		Name: o.Name, Location: o.Location, Dir: download,
		Identities: o.Identities, SHA256: o.SHA256,
	})
	var dl *restore.DownloadError
	switch {
	case errors.Is(err, crypt.ErrIdentityRequired) && o.IdentityProblem != "":
		return Result{NoVerdict: true, Message: "the backup is encrypted and this drill could not read its identity (" + o.IdentityProblem + "): " +
			"nothing was learned about the backup; create or fix the target's drill identitySecret (a Secret in the server's namespace holding an age identity file, " +
			"e.g. kubectl create secret generic NAME --from-file=identity.txt=KEYFILE) and drill it again"}, nil
	case errors.Is(err, crypt.ErrIdentityRequired):
		return Result{NoVerdict: true, Message: "the backup is encrypted and this drill has no identity to decrypt it: " +
			"give the target's drill an identitySecret (a Secret in the server's namespace holding an age identity file) and drill it again"}, nil
	case errors.Is(err, crypt.ErrNoMatchingIdentity):
		// A wrong key says nothing about the backup.
		return Result{NoVerdict: true, Message: "the drill's identity does not decrypt the backup (it is encrypted to other age recipients): " +
			"nothing was learned about the backup; put the identity matching the target's ageRecipients into the drill's identitySecret and drill it again"}, nil
	case errors.As(err, &dl):
		// No verdict about the backup: the server, not the backup, failed.
		return Result{}, fmt.Errorf("drill %q: %w", o.Name, err)
	case err != nil:
		return Result{Message: fmt.Sprintf("the backup does not restore: %v", err)}, nil
	}
	want := v.Backup.GetEtcd()
	if !want.GetKeyspace() {
		return Result{Message: "the backup records no keyspace fingerprint (taken by an older version?): there is nothing to compare a restore with; take a new backup"}, nil
	}
	got, err := restoreAndAsk(ctx, path, filepath.Join(work, "member"), want.GetRevision(), o.StartTimeout)
	if err != nil {
		return Result{Message: fmt.Sprintf("the backup passed its checksums but etcd could not be restored from it: %v", err)}, nil
	}
	got.Message, got.Succeeded = compare(want, got)
	return got, nil
}

// compare says whether the restored member's answers equal the recorded
// fingerprint, and in words what was found.
func compare(want *ebv1.EtcdInfo, got Result) (string, bool) {
	switch {
	case got.Revision != want.GetRevision():
		return fmt.Sprintf("the restored member is at revision %d, the backup recorded %d: the snapshot is not the one its manifest describes (replaced in storage?); do not restore it", got.Revision, want.GetRevision()), false
	case got.Keys != want.GetKeyspaceKeys() || got.HashKV != want.GetHashKv():
		return fmt.Sprintf("the restored keyspace differs from the cluster's at revision %d: %d keys with HashKV %d, the backup recorded %d keys with HashKV %d; do not restore it, take a new backup and drill it",
			got.Revision, got.Keys, got.HashKV, want.GetKeyspaceKeys(), want.GetHashKv()), false
	}
	return fmt.Sprintf("restored with etcd's restore code and served by etcd: revision %d, %d keys, HashKV %d, as recorded", got.Revision, got.Keys, got.HashKV), true
}

// restoreAndAsk rebuilds a one-member data directory from the plain
// snapshot at path, keeping its revision (no bump: the comparison is at
// the recorded revision), starts etcd on it on loopback and asks it.
func restoreAndAsk(ctx context.Context, path, dataDir string, rev int64, startTimeout time.Duration) (Result, error) {
	m, err := loopetcd.Start(ctx, loopetcd.Options{
		Snapshot: path, DataDir: dataDir, StartTimeout: startTimeout,
		// The scratch space holds one copy of the data at a time, beside
		// the member's.
		RemoveSnapshot: true,
	})
	if err != nil {
		return Result{}, err
	}
	defer m.Close()
	return ask(ctx, m.Endpoint, rev)
}

// ask reads the restored member's revision, its number of keys at rev and
// its HashKV at rev: what etcdctl's `get --count-only` and `endpoint
// hashkv --rev` would print.
func ask(ctx context.Context, endpoint string, rev int64) (Result, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(), Context: ctx})
	if err != nil {
		return Result{}, fmt.Errorf("connect to the restored member: %w", err)
	}
	defer c.Close()
	head, err := c.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return Result{}, fmt.Errorf("read the restored member's revision: %w", err)
	}
	got := Result{Revision: head.Header.Revision}
	if got.Revision != rev {
		// Counting at rev would fail (a future revision) or mislead.
		return got, nil
	}
	count, err := c.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(rev))
	if err != nil {
		return got, fmt.Errorf("count the restored member's keys: %w", err)
	}
	hash, err := c.HashKV(ctx, endpoint, rev)
	if err != nil {
		return got, fmt.Errorf("HashKV of the restored member: %w", err)
	}
	got.Keys, got.HashKV = count.Count, hash.Hash
	return got, nil
}
