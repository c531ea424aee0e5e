package domain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/ledger"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// ErrNoLedger is a location whose store keeps no ledger (or is not open
// yet).
var ErrNoLedger = errors.New("this storage location keeps no ledger")

// ledgerCallTimeout bounds one append or page read: the ledger's calls go
// to the store itself, past the bounds of the location's wrappers.
const ledgerCallTimeout = 30 * time.Second

// LedgerStore is the store's ledger, through the wrappers.
func (l *Location) LedgerStore() (storage.LedgerStore, error) {
	if u := l.Unavailable(); u != nil {
		return nil, u
	}
	s, ok := storage.As[storage.LedgerStore](l.Location)
	if !ok {
		return nil, fmt.Errorf("storage location %q: %w", l.Name, ErrNoLedger)
	}
	return s, nil
}

// Record appends e to the location's ledger, its Location set to the
// location's name. Callers log a failure and go on: the act it records
// has happened (or is under way) whether or not the ledger took it.
func (l *Location) Record(ctx context.Context, e ledger.Entry) error {
	l.ledgerMu.Lock()
	w := l.ledger
	if w == nil {
		s, err := l.LedgerStore()
		if err != nil {
			l.ledgerMu.Unlock()
			return err
		}
		w = ledger.NewWriter(s, nil)
		l.ledger = w
	}
	l.ledgerMu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerCallTimeout)
	defer cancel()
	e.Location = l.Name
	_, err := w.Append(ctx, e)
	if l.counted != nil {
		// An entry the store did not take is a storage failure like any:
		// etcdbackup_storage_errors_total{operation="ledger"}, which
		// EtcdBackupStorageErrors alerts on.
		err = l.counted.count("ledger", err)
	}
	return err
}

// Note is Record for callers that go on whatever the ledger says: a
// failure is logged on log, naming what was not recorded.
func (l *Location) Note(ctx context.Context, log *slog.Logger, e ledger.Entry) {
	if err := l.Record(ctx, e); err != nil {
		log.Warn("audit ledger: entry not recorded", "location", l.Name, "action", e.Action, "backup", e.Backup, "who", e.Who, "error", err)
	}
}

// ReadLedger reads a page of the location's ledger: at most limit records
// numbered above after.
func (l *Location) ReadLedger(ctx context.Context, after uint64, limit int) ([]storage.LedgerRecord, error) {
	s, err := l.LedgerStore()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, ledgerCallTimeout)
	defer cancel()
	return s.ReadLedger(ctx, after, limit)
}
