package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"go.etcd.io/etcd/pkg/v3/traceutil"
	"go.etcd.io/etcd/server/v3/lease"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.uber.org/zap"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
)

// ServerKeySecrets are the Secrets in which the data server keeps what its
// trust rests on: the key that signs agent Jobs and the agent port's CA
// (agentjob.SigningKeySecret, agentjob.AgentCASecret). They are
// in every backup of the cluster the server runs in, so a restore of that
// cluster brings back keys every holder of a backup has had: a restore
// removes them (RevokeServerKeys) and the server makes new ones.
var ServerKeySecrets = []string{agentjob.SigningKeySecret, agentjob.AgentCASecret}

// secretsPrefix is where kube-apiserver keeps Secrets (its default
// --etcd-prefix, /registry).
const secretsPrefix = "/registry/secrets/"

// revokePage bounds what is read at once while the Secrets are looked for.
const revokePage = 256

// RevokeServerKeys deletes the data server's key Secrets (ServerKeySecrets,
// in any namespace) from the member data Restore rebuilt in dataDir,
// before etcd first starts on it: one revision past the restored ones,
// which are kept as they were (a revision bump's compaction mark still
// covers them). It returns the keys it deleted; a keyspace without them
// (any etcd but a Kubernetes cluster's with the server installed) is not
// changed at all. Every member of a cluster must get the same call: the
// deletion is then the same revision everywhere.
func RevokeServerKeys(dataDir string) ([]string, error) {
	db := filepath.Join(dataDir, "member", "snap", "db")
	be := backend.NewDefaultBackend(zap.NewNop(), db)
	defer be.Close()
	// etcd's own lessor, read from the member's data so that keys under
	// a lease are restored as etcd restores them; it is never promoted,
	// so it expires nothing.
	le := lease.NewLessor(zap.NewNop(), be, nil, lease.LessorConfig{MinLeaseTTL: 1})
	defer le.Stop()
	s := mvcc.NewStore(zap.NewNop(), be, le, mvcc.StoreConfig{})
	defer s.Close()

	var found []string
	start, end := []byte(secretsPrefix), prefixEnd([]byte(secretsPrefix))
	for {
		txn := s.Read(mvcc.ConcurrentReadTxMode, traceutil.TODO())
		r, err := txn.Range(context.Background(), start, end, mvcc.RangeOptions{Limit: revokePage})
		txn.End()
		if err != nil {
			return nil, fmt.Errorf("look for the server's key Secrets in %s: %w", db, err)
		}
		for _, kv := range r.KVs {
			if isServerKeySecret(string(kv.Key)) {
				found = append(found, string(kv.Key))
			}
		}
		if len(r.KVs) < revokePage {
			break
		}
		start = append(bytes.Clone(r.KVs[len(r.KVs)-1].Key), 0)
	}
	if len(found) == 0 {
		return nil, nil
	}
	// One transaction: one revision.
	txn := s.Write(traceutil.TODO())
	for _, k := range found {
		txn.DeleteRange([]byte(k), nil)
	}
	txn.End()
	s.Commit()
	return found, nil
}

// isServerKeySecret says whether key is /registry/secrets/NS/NAME for a
// NAME of ServerKeySecrets.
func isServerKeySecret(key string) bool {
	ns, name, ok := strings.Cut(strings.TrimPrefix(key, secretsPrefix), "/")
	return ok && ns != "" && !strings.Contains(name, "/") && slices.Contains(ServerKeySecrets, name)
}

// prefixEnd is the end of the range of keys starting with p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}
