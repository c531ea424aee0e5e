// Package drill proves that a backup restores: it fetches the backup pinned
// to its SHA-256 through the data server (package fetch, as a restore
// does, with the same checks), rebuilds a member's data in scratch space with etcd's
// own restore code, starts an etcd on loopback from it, and compares the
// revision, the number of keys and etcd's HashKV that member answers with
// the keyspace fingerprint the backup's manifest recorded — for an agent
// backup, what the live cluster answered at that revision.
package drill

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"filippo.io/age"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
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

// Result is a drill's finding, as the agent reports it to the server
// (its termination message), which records it in the backup's manifest
// (status.verification).
type Result = agentjob.DrillVerdict

// measured is what the restored member answered: the finding so far,
// and the compact revision its HashKV started from (0: never compacted),
// which compare needs and the server does not.
type measured struct {
	Result
	compacted int64
}

// Run drills one backup. A backup that cannot be read back as it was
// stored (its stored SHA-256, age's authentication, etcd's trailer or
// bolt's check fails), does not restore, or restores to something other
// than what was recorded is a Result with Succeeded false and a message
// that names the check. A drill that could not judge the backup (no
// identity or a wrong one, the server unreachable, the scratch space
// full) is a Result with NoVerdict and a message that says what to fix.
// It returns an error only when ctx ended or no scratch directory was
// given.
func Run(ctx context.Context, c *client.Client, o Options) (res Result, err error) {
	defer func(start time.Time) { res.Duration = time.Since(start) }(time.Now())
	return run(ctx, c, o)
}

func run(ctx context.Context, c *client.Client, o Options) (Result, error) {
	if o.ScratchDir == "" {
		return Result{}, errors.New("drill: no scratch directory")
	}
	work, err := os.MkdirTemp(o.ScratchDir, "drill-")
	if err != nil {
		return scratchProblem(err), nil
	}
	defer os.RemoveAll(work)

	download := filepath.Join(work, "download")
	if err := os.Mkdir(download, 0o700); err != nil {
		return scratchProblem(err), nil
	}
	path := filepath.Join(download, o.Name+".db")
	f, err := fetch.Snapshot(ctx, c, fetch.Request{
		Name: o.Name, Location: o.Location, SHA256: o.SHA256, Identities: o.Identities,
		Path: path, Replace: true, CheckDatabase: true,
	})
	if err != nil {
		return fetchVerdict(ctx, o, err)
	}
	want := f.Backup.GetEtcd()
	if !want.GetKeyspace() {
		return Result{Message: "the backup records no keyspace fingerprint (taken by an older version?): there is nothing to compare a restore with; take a new backup"}, nil
	}
	got, err := restoreAndCheck(ctx, path, filepath.Join(work, "member"), want, o.StartTimeout)
	switch {
	case ctx.Err() != nil:
		return Result{}, fmt.Errorf("drill %q: %w", o.Name, ctx.Err())
	case isScratchError(err):
		return scratchProblem(err), nil
	case err != nil:
		return Result{Revision: got.Revision, Message: fmt.Sprintf("the backup passed its checksums but etcd could not be restored from it: %v; do not restore it", err)}, nil
	}
	return got, nil
}

// doNotRestore ends the message of a verdict that the backup's bytes are
// not the ones recorded.
const doNotRestore = "do not restore it: take a new backup, drill it, and find out what changed this one (the storage's access logs)"

// fetchVerdict turns an error of fetching and checking the backup into a
// verdict: Failed when the error says the backup cannot be read back as
// it was stored (each message names the check that failed), no verdict
// when the drill could not judge it (no identity, a wrong one, the
// server unreachable, no scratch space) — with what to fix.
func fetchVerdict(ctx context.Context, o Options, err error) (Result, error) {
	var dl *fetch.Error
	downloadFailed := errors.As(err, &dl) && dl.Kind == fetch.Download
	switch {
	case ctx.Err() != nil:
		return Result{}, fmt.Errorf("drill %q: %w", o.Name, ctx.Err())
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
	case errors.Is(err, fetch.ErrWrongBackup):
		return Result{Message: fmt.Sprintf("the backup does not restore as the drill was started for it: %v", err)}, nil
	case errors.Is(err, client.ErrCorrupt):
		return Result{Message: fmt.Sprintf("the backup does not restore: the stored SHA-256 check failed — the bytes stored are not the ones recorded when the backup was stored (altered or damaged in storage since): %v; %s", err, doNotRestore)}, nil
	case errors.Is(err, crypt.ErrTampered):
		return Result{Message: fmt.Sprintf("the backup does not restore: age's authentication of the encrypted data failed — it was altered or damaged after it was encrypted: %v; %s", err, doNotRestore)}, nil
	case errors.Is(err, snapshot.ErrTooLarge):
		return Result{Message: fmt.Sprintf("the backup does not restore: the plain-size check failed — it unpacks past the size recorded when it was stored: %v; %s", err, doNotRestore)}, nil
	case errors.Is(err, snapshot.ErrCorrupt):
		return Result{Message: fmt.Sprintf("the backup does not restore: etcd's snapshot checks failed (its SHA-256 trailer, the plain size and SHA-256 recorded at upload, or bolt's check of every page): %v; %s", err, doNotRestore)}, nil
	case downloadFailed && status.Code(dl.Err) == codes.DataLoss:
		return Result{Message: fmt.Sprintf("the backup does not restore: the stored-size check failed — the stored data is shorter than the size recorded with it, so its stored SHA-256 cannot match: %v; %s", err, doNotRestore)}, nil
	case downloadFailed && status.Code(dl.Err) == codes.NotFound:
		// The server found no data for the backup, or data other than
		// what its manifest recorded (S3: another object than the one
		// stored). The drill cannot tell that from a backup removed
		// meanwhile: the server, which records the verdict, can (it
		// checks the stored data when a drill reports this).
		return Result{NoVerdict: true, Message: fmt.Sprintf("the data server could not read the backup's stored data (%v): it was removed meanwhile, or its data is missing or not the data recorded with it", err)}, nil
	case downloadFailed:
		return Result{NoVerdict: true, Message: fmt.Sprintf("the drill could not fetch the backup through the data server (%v): nothing was learned about the backup; check that the server runs and that the drill's pod reaches it (its Service, network policies), then drill it again", err)}, nil
	case isScratchError(err):
		return scratchProblem(err), nil
	}
	return Result{NoVerdict: true, Message: fmt.Sprintf("the drill could not check the backup in its scratch space (%v): nothing was learned about the backup; see the drill Job's log, then drill it again", err)}, nil
}

// isScratchError says whether err is the scratch space's: full, or not
// writable.
func isScratchError(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)
}

// scratchProblem is the no-verdict of a drill whose scratch space failed.
func scratchProblem(err error) Result {
	return Result{NoVerdict: true, Message: fmt.Sprintf("the drill's scratch space failed (%v): nothing was learned about the backup; a drill holds the download and the restored member, about twice the database: raise agents.scratchSizeLimit and drill it again", err)}
}

// compare says whether the restored member's answers equal the recorded
// fingerprint, and in words what was found. HashKV is compared only when
// both hashed the same history: the cluster's answer covers the
// revisions after its compact revision (and the newest of each key
// before it), so the restored member is compacted to the same revision
// first (ask); when it cannot be (the snapshot was taken after a later
// compaction), revision and keys are compared and the message says why
// HashKV was not.
func compare(want *ebv1.EtcdInfo, got measured) (string, bool) {
	switch {
	case got.Revision != want.GetRevision():
		return fmt.Sprintf("the restored member is at revision %d, the backup recorded %d: the snapshot is not the one its manifest describes (replaced in storage?); do not restore it", got.Revision, want.GetRevision()), false
	case got.Keys != want.GetKeyspaceKeys() || (got.compacted == want.GetCompactRevision() && got.HashKV != want.GetHashKv()):
		return fmt.Sprintf("the restored keyspace differs from the cluster's at revision %d: %d keys with HashKV %d, the backup recorded %d keys with HashKV %d (both compacted at %d); do not restore it, take a new backup and drill it",
			got.Revision, got.Keys, got.HashKV, want.GetKeyspaceKeys(), want.GetHashKv(), want.GetCompactRevision()), false
	case got.compacted != want.GetCompactRevision():
		why := fmt.Sprintf("the snapshot was compacted at revision %d, after the cluster's HashKV history began (%d): the history between is not in it", got.compacted, want.GetCompactRevision())
		if got.compacted < want.GetCompactRevision() {
			why = fmt.Sprintf("etcd answered the restored member's HashKV over the history since revision %d (a hash it stored while compacting), the cluster's since %d", got.compacted, want.GetCompactRevision())
		}
		return fmt.Sprintf("restored with etcd's restore code and served by etcd: revision %d and %d keys, as recorded; HashKV could not be compared: %s", got.Revision, got.Keys, why), true
	}
	return fmt.Sprintf("restored with etcd's restore code and served by etcd: revision %d, %d keys, HashKV %d (compacted at %d), as recorded", got.Revision, got.Keys, got.HashKV, got.compacted), true
}

// restoreAndCheck rebuilds a one-member data directory from the plain
// snapshot at path, keeping its revision (no bump: the comparison is at
// the recorded revision), starts etcd on it on loopback, asks it and
// compares.
func restoreAndCheck(ctx context.Context, path, dataDir string, want *ebv1.EtcdInfo, startTimeout time.Duration) (Result, error) {
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
	return check(ctx, m.Client, m.Endpoint, want)
}

// check asks the member at endpoint through c and compares its answers
// with want.
func check(ctx context.Context, c *clientv3.Client, endpoint string, want *ebv1.EtcdInfo) (Result, error) {
	got, err := ask(ctx, c, endpoint, want)
	if err != nil {
		return got.Result, err
	}
	got.Message, got.Succeeded = compare(want, got)
	return got.Result, nil
}

// ask reads the restored member's revision, its number of keys at the
// recorded revision and its HashKV there: what etcdctl's `get
// --count-only` and `endpoint hashkv --rev` would print. A member
// compacted below the revision the cluster's HashKV started from is
// compacted there first, so that both hash the same history.
func ask(ctx context.Context, c *clientv3.Client, endpoint string, want *ebv1.EtcdInfo) (measured, error) {
	rev := want.GetRevision()
	head, err := c.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return measured{}, fmt.Errorf("read the restored member's revision: %w", err)
	}
	got := measured{Result: Result{Revision: head.Header.Revision}}
	if got.Revision != rev {
		// Counting at rev would fail (a future revision) or mislead.
		return got, nil
	}
	count, err := c.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(rev))
	if err != nil {
		return got, fmt.Errorf("count the restored member's keys: %w", err)
	}
	got.Keys = count.Count
	hash, err := c.HashKV(ctx, endpoint, rev)
	if err != nil {
		return got, fmt.Errorf("HashKV of the restored member: %w", err)
	}
	// etcd says -1 for a keyspace never compacted, as the backup records 0.
	got.HashKV, got.compacted = hash.Hash, max(0, hash.CompactRevision)
	if wantCompacted := want.GetCompactRevision(); got.compacted < wantCompacted && wantCompacted <= rev {
		if _, err := c.Compact(ctx, wantCompacted, clientv3.WithCompactPhysical()); err != nil {
			return got, fmt.Errorf("compact the restored member at revision %d, as the cluster was when it answered HashKV: %w", wantCompacted, err)
		}
		if hash, err = c.HashKV(ctx, endpoint, rev); err != nil {
			return got, fmt.Errorf("HashKV of the restored member compacted at revision %d: %w", wantCompacted, err)
		}
		got.HashKV, got.compacted = hash.Hash, max(0, hash.CompactRevision)
	}
	return got, nil
}
