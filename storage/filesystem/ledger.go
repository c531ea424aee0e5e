package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

var _ storage.LedgerStore = (*Location)(nil)

// ledgerDir holds the ledger's records: ROOT/ledger/NNN….json.
func (l *Location) ledgerDir() string { return filepath.Join(l.root, "ledger") }

// AppendLedger implements storage.LedgerStore: the record is written to a
// temporary file, synced, and linked to its name, which link(2) never
// replaces. A read-only location appends too (a break-glass read is
// recorded), in the ledger directory only, with a temporary file there.
func (l *Location) AppendLedger(ctx context.Context, seq uint64, b []byte) error {
	if len(b) > storage.MaxLedgerRecord {
		return fmt.Errorf("ledger record %d: %d bytes, more than %d", seq, len(b), storage.MaxLedgerRecord)
	}
	dir := l.ledgerDir()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("ledger of %s: %w", l.root, noSpace(err))
	}
	f, err := os.CreateTemp(dir, ".append-*")
	if err != nil {
		return fmt.Errorf("ledger of %s: %w", l.root, noSpace(err))
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write ledger record %d in %s: %w", seq, l.root, noSpace(err))
	}
	if err := os.Link(tmp, filepath.Join(dir, storage.LedgerName(seq))); errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("ledger record %d: %w", seq, storage.ErrAlreadyExists)
	} else if err != nil {
		return fmt.Errorf("write ledger record %d in %s: %w", seq, l.root, err)
	}
	return syncDir(dir)
}

// ReadLedger implements storage.LedgerStore.
func (l *Location) ReadLedger(ctx context.Context, after uint64, limit int) ([]storage.LedgerRecord, error) {
	seqs, err := l.ledgerSeqs(after)
	if err != nil {
		return nil, err
	}
	if limit > 0 && len(seqs) > limit {
		seqs = seqs[:limit]
	}
	out := make([]storage.LedgerRecord, 0, len(seqs))
	for _, n := range seqs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rec, err := l.readLedgerRecord(n)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// LedgerTail implements storage.LedgerStore.
func (l *Location) LedgerTail(ctx context.Context) (*storage.LedgerRecord, error) {
	seqs, err := l.ledgerSeqs(0)
	if err != nil || len(seqs) == 0 {
		return nil, err
	}
	rec, err := l.readLedgerRecord(seqs[len(seqs)-1])
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// ledgerSeqs are the numbers of the records above after, in order.
func (l *Location) ledgerSeqs(after uint64) ([]uint64, error) {
	entries, err := os.ReadDir(l.ledgerDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the ledger of %s: %w", l.root, err)
	}
	var seqs []uint64
	for _, e := range entries {
		if n, ok := storage.LedgerSeq(e.Name()); ok && n > after {
			seqs = append(seqs, n)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// readLedgerRecord reads record n.
func (l *Location) readLedgerRecord(n uint64) (storage.LedgerRecord, error) {
	b, err := readLedgerFile(filepath.Join(l.ledgerDir(), storage.LedgerName(n)))
	if err != nil {
		return storage.LedgerRecord{}, fmt.Errorf("ledger record %d in %s: %w", n, l.root, err)
	}
	return storage.LedgerRecord{Seq: n, Data: b}, nil
}

// readLedgerFile reads a regular file, at most MaxLedgerRecord bytes of
// it (a longer one is an error: the ledger writes none).
func readLedgerFile(path string) ([]byte, error) {
	f, _, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, storage.MaxLedgerRecord+1))
	if err != nil {
		return nil, err
	}
	if len(b) > storage.MaxLedgerRecord {
		return nil, fmt.Errorf("more than %d bytes: not a ledger record", storage.MaxLedgerRecord)
	}
	return b, nil
}
