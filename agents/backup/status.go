package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/mem"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// statusCopy keeps a copy of the plain snapshot in the agent's scratch
// space while it streams, so that once etcd has sent all of it the agent
// can read what etcdutl snapshot status reads — the snapshot's own
// revision, keys and hash — and check that bolt opens it. etcd says none
// of that about a snapshot it sends (the member's revision before the
// snapshot is only a lower bound under writes), and bolt needs random
// access: the stream alone cannot tell. The copy is the only thing the
// agent writes to disk; memory stays flat.
type statusCopy struct {
	f    *os.File
	once sync.Once
	err  error // the first write error

	// The member the snapshot came from, asked for the keyspace
	// fingerprint at the snapshot's revision once it is known.
	ctx      context.Context
	etcd     *clientv3.Client
	endpoint string
	// authRevision is etcd's auth revision read before the snapshot
	// (0: unknown). AuthStatus goes through raft: asked after the
	// snapshot it would move the member's consistent index past it.
	authRevision uint64
}

// newStatusCopy creates the copy in dir; "" keeps none (then no status is
// read and the backup records the member's revision only). etcd is a
// client of the member at endpoint only.
func newStatusCopy(ctx context.Context, dir string, etcd *clientv3.Client, endpoint string) (*statusCopy, error) {
	if dir == "" {
		return nil, nil
	}
	f, err := os.CreateTemp(dir, "snapshot-*.db")
	if err != nil {
		return nil, fmt.Errorf("scratch copy of the snapshot (to read its status): %w", err)
	}
	c := &statusCopy{f: f, ctx: ctx, etcd: etcd, endpoint: endpoint}
	if etcd != nil {
		// Users and roles are not in the watch stream: a restore to a
		// point warns when a segment's auth revision differs from this.
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if as, err := etcd.AuthStatus(actx); err == nil {
			c.authRevision = as.AuthRevision
		}
		cancel()
	}
	return c, nil
}

// Write appends p; after a failure it keeps failing, so the backup fails
// rather than record a status read from part of the snapshot.
func (c *statusCopy) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.f.Write(p)
	if err != nil {
		c.err = fmt.Errorf("scratch copy of the snapshot in %s (agents.scratchSizeLimit bounds it): %w", c.f.Name(), err)
	}
	return n, c.err
}

// writeBuffers appends the bytes of a relayed chunk.
func (c *statusCopy) writeBuffers(chunk mem.BufferSlice) error {
	for _, b := range chunk {
		if _, err := c.Write(b.ReadOnlyData()); err != nil {
			return err
		}
	}
	return nil
}

// Status reads the whole copy's status with etcd's own code (bolt's
// consistency check of every page included) and returns it as the facts
// an upload's trailer carries. Call it once the stream ended.
func (c *statusCopy) Status() (*ebv1.EtcdInfo, error) {
	if c.err != nil {
		return nil, c.err
	}
	if err := c.f.Close(); err != nil {
		return nil, fmt.Errorf("scratch copy of the snapshot: %w", err)
	}
	st, err := snapshot.CheckDatabase(c.f.Name())
	if err != nil {
		return nil, fmt.Errorf("the snapshot etcd sent: %w", err)
	}
	facts := snapshot.Facts(st)
	c.addKeyspace(facts)
	return facts, nil
}

// addKeyspace asks the member, right after the snapshot, for the keyspace
// fingerprint at the snapshot's revision: HashKV and the keys there. It is
// the live cluster's, not the file's, so a restore of the backup can be
// proven equal to the cluster it came from (a drill). A member that has
// compacted past the revision meanwhile, or does not answer, leaves it
// unrecorded rather than fail a backup that is whole.
func (c *statusCopy) addKeyspace(facts *ebv1.EtcdInfo) {
	rev := facts.GetRevision()
	if c.etcd == nil || rev <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, keyspaceTimeout)
	defer cancel()
	hk, err := c.etcd.HashKV(ctx, c.endpoint, rev)
	if err != nil {
		return
	}
	count, err := c.etcd.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly(), clientv3.WithRev(rev), clientv3.WithSerializable())
	if err != nil {
		return
	}
	// The compact revision is the one etcd's HashKV answer started from
	// (the history it hashed): a drill compacts the restored member there
	// before comparing. etcd says -1 for a keyspace never compacted.
	facts.KeyspaceKeys, facts.HashKv, facts.CompactRevision, facts.Keyspace = count.Count, hk.Hash, max(0, hk.CompactRevision), true
	facts.AuthRevision = c.authRevision
}

// keyspaceTimeout bounds the questions to the member after the snapshot:
// HashKV reads its whole keyspace.
const keyspaceTimeout = 2 * time.Minute

// Remove deletes the copy; safe to call more than once.
func (c *statusCopy) Remove() {
	if c == nil {
		return
	}
	c.once.Do(func() {
		c.f.Close()
		if err := os.Remove(c.f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
			c.err = err
		}
	})
}
