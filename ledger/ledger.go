// Package ledger keeps a location's audit ledger: an append-only log of
// what was done with its backups (stored, downloaded, deleted, restored,
// drilled, copied, read break-glass), each entry carrying the SHA-256 of
// the one before it, so that a removed or changed entry breaks the chain
// where it was. It writes and reads through storage.LedgerStore and
// verifies what it reads; it decides nothing about who may do what.
package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Actions an entry records.
const (
	ActionUpload     = "upload"
	ActionDownload   = "download"
	ActionDelete     = "delete"
	ActionPrune      = "prune"
	ActionRestore    = "restore"
	ActionDrill      = "drill"
	ActionCopy       = "copy"
	ActionBreakGlass = "break-glass read"
)

// Entry is one record of the ledger.
type Entry struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Action is one of the Action constants.
	Action   string `json:"action"`
	Location string `json:"location"`
	Backup   string `json:"backup,omitempty"`
	// SHA256 is the backup's stored SHA-256, when known.
	SHA256 string `json:"sha256,omitempty"`
	// Who did it: a Kubernetes user ("user alice", "serviceaccount
	// ns/name"), an agent ("agent Job ns/name"), the server's own
	// controller ("server (retention)"), or "break-glass on HOST".
	Who string `json:"who"`
	// Detail says more (a restore's target, a copy's destination).
	Detail string `json:"detail,omitempty"`
	// Prev is the SHA-256 of the previous record's stored bytes; empty
	// for the first.
	Prev string `json:"prev"`
}

// Record is one record as stored: its number and bytes.
type Record = storage.LedgerRecord

// Hash is the SHA-256 of a record's stored bytes, as the next one's Prev
// names it.
func Hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Writer appends to one location's ledger. It is safe for concurrent
// use; writers in other processes (replicas, break-glass) append to the
// same ledger, a record number taken by one of them is read and the
// append tried again after it.
type Writer struct {
	store storage.LedgerStore
	now   func() time.Time

	mu     sync.Mutex
	loaded bool
	seq    uint64 // the newest record known
	head   string // its hash
}

// NewWriter appends to store's ledger; now stamps the entries (nil:
// time.Now).
func NewWriter(store storage.LedgerStore, now func() time.Time) *Writer {
	if now == nil {
		now = time.Now
	}
	return &Writer{store: store, now: now}
}

// maxTries bounds the appends one Append makes when other writers keep
// taking the next number; between tries it waits a random while, up to
// a few milliseconds more each time, so that writers that collided do
// not collide again in step.
const maxTries = 64

// Append records e (its Seq, Time and Prev are set here) after the
// newest record of the ledger, and returns it as stored.
func (w *Writer) Append(ctx context.Context, e Entry) (Entry, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Time.IsZero() {
		e.Time = w.now().UTC()
	}
	conflict := false
	for try := range maxTries {
		if !w.loaded || conflict {
			if err := w.catchUp(ctx); err != nil {
				return e, err
			}
		}
		e.Seq, e.Prev = w.seq+1, w.head
		b, err := json.Marshal(e)
		if err != nil {
			return e, err
		}
		err = w.store.AppendLedger(ctx, e.Seq, b)
		if conflict = errors.Is(err, storage.ErrAlreadyExists); conflict {
			// Another writer took the number: read it, go after it.
			select {
			case <-time.After(time.Duration(rand.Int64N(int64(try+1) * int64(2*time.Millisecond)))):
			case <-ctx.Done():
				return e, ctx.Err()
			}
			continue
		}
		if err != nil {
			return e, fmt.Errorf("append to the ledger: %w", err)
		}
		w.seq, w.head = e.Seq, Hash(b)
		return e, nil
	}
	return e, fmt.Errorf("append to the ledger: %d tries found the next record taken by another writer", maxTries)
}

// catchUp finds the ledger's newest record: the first time its tail,
// later (another writer appended) the records after the newest one w
// knows.
func (w *Writer) catchUp(ctx context.Context) error {
	if !w.loaded {
		tail, err := w.store.LedgerTail(ctx)
		if err != nil {
			return fmt.Errorf("read the ledger's end: %w", err)
		}
		if tail != nil {
			w.seq, w.head = tail.Seq, Hash(tail.Data)
		}
		w.loaded = true
		return nil
	}
	recs, err := w.store.ReadLedger(ctx, w.seq, 0)
	if err != nil {
		return fmt.Errorf("read the ledger's end: %w", err)
	}
	if n := len(recs); n > 0 {
		w.seq, w.head = recs[n-1].Seq, Hash(recs[n-1].Data)
	}
	return nil
}
