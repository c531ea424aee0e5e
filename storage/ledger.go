package storage

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// LedgerStore is a location that keeps an append-only ledger beside its
// backups: numbered records (1, 2, …), each written once and never
// replaced, under the location's object lock where it has one. What a
// record holds and how records chain is package ledger's business.
type LedgerStore interface {
	// AppendLedger stores record seq with content b, only if no record
	// seq exists (ErrAlreadyExists otherwise: another writer took it).
	// A location opened read-only appends all the same where its store
	// lets it: a break-glass read is recorded too.
	AppendLedger(ctx context.Context, seq uint64, b []byte) error
	// ReadLedger returns the records numbered above after, in order, at
	// most limit of them (0: all).
	ReadLedger(ctx context.Context, after uint64, limit int) ([]LedgerRecord, error)
	// LedgerTail returns the newest record, nil when there is none,
	// reading no other.
	LedgerTail(ctx context.Context) (*LedgerRecord, error)
}

// LedgerRecord is one stored ledger record.
type LedgerRecord struct {
	Seq  uint64
	Data []byte
}

// MaxLedgerRecord bounds a record's size, read or written.
const MaxLedgerRecord = 64 << 10

// ledgerSuffix ends a record's object name: NNNNNNNNNNNNNNNNNNNN.json.
const ledgerSuffix = ".json"

// LedgerName is the object (file) name of record seq: its number in 20
// digits, so that names sort as numbers do.
func LedgerName(seq uint64) string { return fmt.Sprintf("%020d%s", seq, ledgerSuffix) }

// LedgerSeq reads a record's number back from its name.
func LedgerSeq(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, ledgerSuffix)
	if !ok || len(digits) != 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	return n, err == nil && n > 0
}
