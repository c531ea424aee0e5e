// Package fold compacts a delta chain: it fetches the chain's full backup
// and its segments through the data server, each pinned to its SHA-256
// (as a restore to a point does, with the same checks), replays the
// segments onto the full up to the chain's last revision (delta/replay),
// compacts the result at that revision and defragments it (a fold keeps
// no history: without that every fold would carry all the revisions of
// every chain before it), checks it as a drill checks a backup — etcd
// restores it, serves it on loopback and answers at exactly that
// revision, with its number of keys and HashKV — and stores it through
// the server as a new full backup of the target, recording those answers
// as its keyspace fingerprint. The
// server's delta supervisor then starts the next chain from it, so a
// restore to a point replays at most one chain's worth of revisions.
package fold

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"filippo.io/age"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	clientsnapshot "go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta/replay"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/fetch"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/loopetcd"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Inputs are what a fold reads: the chain's full backup and its
// segments, in chain order, each pinned to its stored SHA-256, and the
// revision the chain reaches. The server writes them, as JSON, into the
// fold Job's annotation, which the agent reads from a file the downward
// API mounts: a chain's list of segments can be longer than arguments
// should be.
type Inputs = agentjob.FoldInputs

// Options say what to fold and where to store the result.
type Options struct {
	Inputs
	// Target is the etcd target the chain is of, recorded with the new
	// backup.
	Target string
	// Name is the new full backup's; Location is where the chain is
	// stored and where the new backup goes ("" the server's default).
	Name, Location string
	// Identities decrypt an encrypted chain.
	Identities []age.Identity
	// IdentityProblem says why the identities the fold was meant to have
	// could not be read (the identity Secret does not exist, so its
	// optional volume is empty, or it holds no age identity); "" when
	// there was none to read or they were read.
	IdentityProblem string
	// Compression (one of ebv1.Compressions) and AgeRecipients encode the
	// new backup as the target's backups are.
	Compression   string
	AgeRecipients []string
	// ScratchDir holds the downloads, the replay and the checked member;
	// it is emptied when the fold ends.
	ScratchDir string
	// StartTimeout bounds how long each loopback etcd may take to serve.
	StartTimeout time.Duration
}

// Result is a fold's finding, as the agent reports it to the server (its
// termination message).
type Result = agentjob.FoldVerdict

// Run folds one chain. It returns an error only when it reached no
// verdict about the chain (the server did not answer or refused the new
// backup, the scratch space is unusable); a chain that does not replay,
// or replays to something etcd does not serve at its last revision, is a
// Result with Succeeded false and nothing stored.
func Run(ctx context.Context, c *client.Client, o Options) (res Result, err error) {
	defer func(start time.Time) { res.Duration = time.Since(start) }(time.Now())
	return run(ctx, c, o)
}

func run(ctx context.Context, c *client.Client, o Options) (Result, error) {
	if err := o.Inputs.Validate(); err != nil {
		return Result{}, fmt.Errorf("fold: the chain to fold: %w", err)
	}
	if o.Name == "" || o.ScratchDir == "" {
		return Result{}, errors.New("fold: a name for the new backup and a scratch directory are required")
	}
	if err := ebv1.ValidateCompression(o.Compression); err != nil {
		return Result{}, fmt.Errorf("fold: %w", err)
	}
	var recipients []age.Recipient
	if len(o.AgeRecipients) > 0 {
		var err error
		if recipients, err = crypt.ParseRecipients(o.AgeRecipients); err != nil {
			return Result{}, fmt.Errorf("fold: encryption: %w", err)
		}
	}
	work, err := os.MkdirTemp(o.ScratchDir, "fold-")
	if err != nil {
		return Result{}, fmt.Errorf("fold: scratch space: %w", err)
	}
	defer os.RemoveAll(work)

	replayedPath, replayed, res, err := build(ctx, c, o, work)
	if err != nil || res.Message != "" {
		return res, err
	}
	out := filepath.Join(work, "compacted.db")
	served, err := compact(ctx, replayedPath, out, filepath.Join(work, "compact"), o.ToRevision, o.StartTimeout)
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("fold of chain %q: %w", o.Full.Name, err)
		}
		return Result{Revisions: replayed.Revisions, Message: fmt.Sprintf("the replayed chain could not be compacted at revision %d: %v; nothing was stored", o.ToRevision, err)}, nil
	}
	got, compacted := Result{Revision: served}, int64(0)
	if served == o.ToRevision {
		got, compacted, err = serveAndAsk(ctx, out, filepath.Join(work, "check"), o.ToRevision, o.StartTimeout)
		if err != nil {
			return Result{Revisions: replayed.Revisions, Message: fmt.Sprintf("the replayed chain did not restore: %v; nothing was stored", err)}, nil
		}
	}
	got.Revisions = replayed.Revisions
	if got.Revision != o.ToRevision {
		got.Message = fmt.Sprintf("the replayed chain restores to revision %d, not the chain's last revision %d: nothing was stored; drill the chain's full backup and check its segments (`kubectl etcdbackup describe %s`)",
			got.Revision, o.ToRevision, o.Full.Name)
		return got, nil
	}
	st, err := snapshot.Check(out)
	if err != nil {
		got.Message = fmt.Sprintf("the replayed snapshot fails etcd's checks: %v; nothing was stored", err)
		return got, nil
	}
	if st.Revision != o.ToRevision {
		// What the manifest records and a chain from the fold starts
		// after: it must be the revision etcd serves.
		got.Message = fmt.Sprintf("the folded snapshot's status says revision %d, etcd serves it at %d: nothing was stored", st.Revision, o.ToRevision)
		return got, nil
	}
	facts := snapshot.Facts(st)
	facts.Version, facts.DbSize = st.Version, st.TotalSize
	facts.KeyspaceKeys, facts.HashKv, facts.CompactRevision, facts.Keyspace = got.Keys, got.HashKV, compacted, true
	b, err := upload(ctx, c, o, out, facts, replayed.Time, recipients)
	if err != nil {
		return got, fmt.Errorf("fold: store the folded chain as backup %q: %w", o.Name, err)
	}
	got.Succeeded, got.Backup = true, b.GetName()
	got.Message = fmt.Sprintf("folded chain %s (%d revisions replayed) into backup %s, compacted at revision %d (%s): served by etcd at revision %d, %d keys, HashKV %d",
		o.Full.Name, replayed.Revisions, b.GetName(), compacted, sizeString(st.TotalSize), got.Revision, got.Keys, got.HashKV)
	return got, nil
}

// build fetches the chain and replays it into work; res carries a
// verdict (Message set) when the chain itself is at fault.
func build(ctx context.Context, c *client.Client, o Options, work string) (out string, replayed replay.Result, res Result, err error) {
	download := filepath.Join(work, "download")
	if err := os.Mkdir(download, 0o700); err != nil {
		return "", replayed, Result{}, fmt.Errorf("fold: scratch space: %w", err)
	}
	verdict := func(what string, err error) (string, replay.Result, Result, error) {
		switch {
		case errors.Is(err, crypt.ErrIdentityRequired) && o.IdentityProblem != "":
			return "", replayed, Result{NoVerdict: true, Message: "the chain is encrypted and this fold could not read its identity (" + o.IdentityProblem + "): " +
				"create or fix the target's deltas identitySecret (a Secret in the server's namespace holding an age identity file)"}, nil
		case errors.Is(err, crypt.ErrIdentityRequired):
			return "", replayed, Result{NoVerdict: true, Message: "the chain is encrypted and this fold has no identity to decrypt it: " +
				"give the target's deltas an identitySecret (a Secret in the server's namespace holding an age identity file)"}, nil
		case errors.Is(err, crypt.ErrNoMatchingIdentity):
			// A wrong key says nothing about the chain.
			return "", replayed, Result{NoVerdict: true, Message: "the fold's identity does not decrypt the chain (it is encrypted to other age recipients): " +
				"put the identity matching the target's ageRecipients into the deltas' identitySecret"}, nil
		case fetch.KindOf(err) == fetch.Download:
			return "", replayed, Result{}, fmt.Errorf("fold of chain %q: %s: %w", o.Full.Name, what, err)
		}
		return "", replayed, Result{Message: fmt.Sprintf("%s: %v; nothing was stored", what, err)}, nil
	}
	base := filepath.Join(download, o.Full.Name+".db")
	v, err := fetch.Snapshot(ctx, c, fetch.Request{
		Name: o.Full.Name, Location: o.Location, SHA256: o.Full.SHA256, Identities: o.Identities,
		Path: base, Replace: true, CheckDatabase: true,
	})
	if err != nil {
		return verdict("the chain's full backup", err)
	}
	baseRev := v.Backup.GetEtcd().GetRevision()
	if baseRev == 0 {
		baseRev = v.Status.Revision
	}
	segs := make([]string, 0, len(o.Segments))
	for _, s := range o.Segments {
		p := filepath.Join(download, s.Name)
		err := fetch.Segment(ctx, c, fetch.Request{Name: s.Name, Location: o.Location, SHA256: s.SHA256, Identities: o.Identities, Path: p})
		if err != nil {
			return verdict("delta segment "+s.Name, err)
		}
		segs = append(segs, p)
	}
	out = filepath.Join(work, "folded.db")
	replayed, err = replay.Build(ctx, replay.Options{
		BasePath: base, BaseRevision: baseRev, Segments: segs, Point: delta.Point{Revision: o.ToRevision},
		WorkDir: filepath.Join(work, "replay"), OutPath: out, StartTimeout: o.StartTimeout,
	})
	if err != nil {
		if ctx.Err() != nil {
			return "", replayed, Result{}, fmt.Errorf("fold of chain %q: %w", o.Full.Name, err)
		}
		return "", replayed, Result{Message: fmt.Sprintf("the chain does not replay to revision %d: %v; nothing was stored", o.ToRevision, err)}, nil
	}
	// The scratch space holds the result and, next, the member that
	// checks it: the inputs go.
	_ = os.RemoveAll(download)
	return out, replayed, Result{}, nil
}

// compact restores the replayed snapshot at path into dataDir without a
// bump (removing path: the scratch space holds one copy of the data at a
// time) and returns the revision it serves; when that is rev it compacts
// the member there, physically, defragments it and saves its snapshot to
// out. etcd's
// snapshot of a member compacted at its current revision keeps that
// revision: the compact revision, recorded in the meta bucket, is the
// revision a member restored from it serves (snapshot.Check reads it the
// same way).
func compact(ctx context.Context, path, out, dataDir string, rev int64, startTimeout time.Duration) (served int64, err error) {
	m, err := loopetcd.Start(ctx, loopetcd.Options{Snapshot: path, DataDir: dataDir, StartTimeout: startTimeout, RemoveSnapshot: true})
	if err != nil {
		return 0, err
	}
	defer func() {
		m.Close()
		_ = os.RemoveAll(dataDir)
	}()
	head, err := m.Client.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("read the replayed member's revision: %w", err)
	}
	if served = head.Header.Revision; served != rev {
		return served, nil
	}
	if _, err := m.Client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return served, fmt.Errorf("compact at revision %d: %w", rev, err)
	}
	if _, err := m.Client.Defragment(ctx, m.Endpoint); err != nil {
		return served, fmt.Errorf("defragment: %w", err)
	}
	cfg := m.Config()
	cfg.Context = ctx
	if _, err := clientsnapshot.SaveWithVersion(ctx, zap.NewNop(), cfg, out); err != nil {
		return served, fmt.Errorf("save the compacted keyspace: %w", err)
	}
	return served, nil
}

// serveAndAsk restores the snapshot at path into dataDir without a bump,
// serves it on loopback and reads its revision, its number of keys at
// rev, its HashKV at rev and the revision it is compacted at. The
// snapshot stays: it is what is stored.
func serveAndAsk(ctx context.Context, path, dataDir string, rev int64, startTimeout time.Duration) (Result, int64, error) {
	m, err := loopetcd.Start(ctx, loopetcd.Options{Snapshot: path, DataDir: dataDir, StartTimeout: startTimeout})
	if err != nil {
		return Result{}, 0, err
	}
	defer func() {
		m.Close()
		_ = os.RemoveAll(dataDir)
	}()
	c := m.Client
	head, err := c.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return Result{}, 0, fmt.Errorf("read the checking member's revision: %w", err)
	}
	got := Result{Revision: head.Header.Revision}
	if got.Revision != rev {
		return got, 0, nil
	}
	count, err := c.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(rev))
	if err != nil {
		return got, 0, fmt.Errorf("count the checking member's keys: %w", err)
	}
	hash, err := c.HashKV(ctx, m.Endpoint, rev)
	if err != nil {
		return got, 0, fmt.Errorf("HashKV of the checking member: %w", err)
	}
	got.Keys, got.HashKV = count.Count, hash.Hash
	// etcd says -1 for a keyspace never compacted, as a backup records 0.
	return got, max(0, hash.CompactRevision), nil
}

func sizeString(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

// upload stores the plain snapshot at path as a full backup of the
// target, compressed and encrypted as the target's backups are, with
// facts as its snapshot status. Its source's start time is when the last
// folded revision was seen: a restore to a time picks chains by it.
func upload(ctx context.Context, c *client.Client, o Options, path string, facts *ebv1.EtcdInfo, seen time.Time, recipients []age.Recipient) (*ebv1.Backup, error) {
	h := &ebv1.UploadHeader{
		Name: o.Name, Location: o.Location, Compression: o.Compression, Encryption: ebv1.EncryptionNone,
		Etcd:   facts,
		Source: &ebv1.BackupSource{Kind: ebv1.SourceAgent, Target: o.Target},
	}
	if !seen.IsZero() {
		h.Source.StartTime = timestamppb.New(seen)
	}
	if len(recipients) > 0 {
		h.Encryption, h.AgeRecipients = ebv1.EncryptionAge, o.AgeRecipients
	}
	// Each attempt reads the file anew through a file of its own: the
	// encoder of an abandoned attempt may still be reading its own.
	var (
		plain  *snapshot.Verifier
		closer []io.Closer
	)
	defer func() {
		for _, cl := range closer {
			cl.Close()
		}
	}()
	open := func() (io.Reader, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		closer = append(closer, f)
		plain = snapshot.NewVerifier(f, snapshot.VerifierOptions{HashWhole: true})
		enc, err := snapshot.Compress(ctx, plain, o.Compression)
		if err != nil {
			return nil, err
		}
		closer = append(closer, enc)
		if len(recipients) == 0 {
			return enc, nil
		}
		return crypt.Encrypt(ctx, enc, recipients)
	}
	body, err := open()
	if err != nil {
		return nil, err
	}
	req := client.UploadRequest{
		Header: h,
		Rewind: open,
		Etcd:   func() (*ebv1.EtcdInfo, error) { return facts, nil },
	}
	if o.Compression != ebv1.CompressionNone || len(recipients) > 0 {
		// The server sees only the encoded bytes: the plain ones' size and
		// SHA-256 are the agent's to send (and its trailer check).
		req.Raw = func() (int64, string) { return plain.Size(), plain.SHA256() }
	}
	b, err := c.UploadWith(ctx, body, req)
	if verr := plain.Err(); verr != nil && ctx.Err() == nil && err != nil {
		return nil, fmt.Errorf("the folded snapshot changed while it was stored: %w (nothing was stored)", verr)
	}
	return b, err
}
