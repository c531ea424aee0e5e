package s3

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3sdk "github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sync/errgroup"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

var _ storage.LedgerStore = (*Location)(nil)

// ledgerKey is where the ledger's records are: PREFIX/ledger/NNN….json,
// beside PREFIX/backups/.
func (l *Location) ledgerKey() string {
	return joinKey(l.cfg.Prefix, "ledger") + "/"
}

// AppendLedger implements storage.LedgerStore: a create-only PUT
// (If-None-Match: *), under the location's object lock. A read-only
// location appends too, where its credentials may: a break-glass read is
// recorded.
func (l *Location) AppendLedger(ctx context.Context, seq uint64, b []byte) error {
	if len(b) > storage.MaxLedgerRecord {
		return fmt.Errorf("ledger record %d: %d bytes, more than %d", seq, len(b), storage.MaxLedgerRecord)
	}
	key := l.ledgerKey() + storage.LedgerName(seq)
	put := &s3sdk.PutObjectInput{
		Bucket:        aws.String(l.cfg.Bucket),
		Key:           aws.String(key),
		Body:          bytes.NewReader(b),
		ContentLength: aws.Int64(int64(len(b))),
		ContentType:   aws.String("application/json"),
	}
	if l.cfg.NoConditionalWrites {
		// The store cannot refuse a second writer: look first (two
		// replicas appending at the same instant may still both write).
		if _, err := l.head(ctx, key); err == nil {
			return fmt.Errorf("ledger record %d: %w", seq, storage.ErrAlreadyExists)
		} else if !isNotFound(err) {
			return fmt.Errorf("ledger record %d in %s: %w", seq, l.where, err)
		}
	} else {
		put.IfNoneMatch = aws.String("*")
	}
	if mode, until := l.retention(time.Now()); until != nil {
		put.ObjectLockMode, put.ObjectLockRetainUntilDate = mode, until
	}
	if _, err := l.client.PutObject(ctx, put); err != nil {
		if isPreconditionFailed(err) {
			return fmt.Errorf("ledger record %d: %w", seq, storage.ErrAlreadyExists)
		}
		return fmt.Errorf("write ledger record %d to %s: %w", seq, l.where, err)
	}
	return nil
}

// ReadLedger implements storage.LedgerStore: one listing from after on,
// then a GET per record.
func (l *Location) ReadLedger(ctx context.Context, after uint64, limit int) ([]storage.LedgerRecord, error) {
	seqs, err := l.ledgerSeqs(ctx, after, limit)
	if err != nil {
		return nil, err
	}
	// A GET per record, listConcurrency at a time, as List reads
	// manifests.
	out := make([]storage.LedgerRecord, len(seqs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	for i, n := range seqs {
		g.Go(func() error {
			b, err := l.readLedgerRecord(gctx, n)
			out[i] = storage.LedgerRecord{Seq: n, Data: b}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// LedgerTail implements storage.LedgerStore: the whole listing (1,000
// names a request), then one GET.
func (l *Location) LedgerTail(ctx context.Context) (*storage.LedgerRecord, error) {
	seqs, err := l.ledgerSeqs(ctx, 0, 0)
	if err != nil || len(seqs) == 0 {
		return nil, err
	}
	newest := seqs[len(seqs)-1]
	b, err := l.readLedgerRecord(ctx, newest)
	if err != nil {
		return nil, err
	}
	return &storage.LedgerRecord{Seq: newest, Data: b}, nil
}

// ledgerSeqs lists the numbers of the records above after, in order (the
// names sort as the numbers do), at most limit of them (0: all).
func (l *Location) ledgerSeqs(ctx context.Context, after uint64, limit int) ([]uint64, error) {
	prefix := l.ledgerKey()
	in := &s3sdk.ListObjectsV2Input{Bucket: aws.String(l.cfg.Bucket), Prefix: aws.String(prefix)}
	if after > 0 {
		in.StartAfter = aws.String(prefix + storage.LedgerName(after))
	}
	var seqs []uint64
	p := s3sdk.NewListObjectsV2Paginator(l.client, in)
	for p.HasMorePages() && (limit <= 0 || len(seqs) < limit) {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list the ledger of %s: %w", l.where, err)
		}
		for _, o := range page.Contents {
			if n, ok := storage.LedgerSeq(strings.TrimPrefix(aws.ToString(o.Key), prefix)); ok && n > after {
				seqs = append(seqs, n)
			}
		}
	}
	if limit > 0 && len(seqs) > limit {
		seqs = seqs[:limit]
	}
	return seqs, nil
}

// readLedgerRecord reads record n, at most MaxLedgerRecord bytes of it.
func (l *Location) readLedgerRecord(ctx context.Context, n uint64) ([]byte, error) {
	got, err := l.client.GetObject(ctx, &s3sdk.GetObjectInput{Bucket: aws.String(l.cfg.Bucket), Key: aws.String(l.ledgerKey() + storage.LedgerName(n))})
	if err != nil {
		return nil, fmt.Errorf("ledger record %d in %s: %w", n, l.where, err)
	}
	defer got.Body.Close()
	b, err := io.ReadAll(io.LimitReader(got.Body, storage.MaxLedgerRecord+1))
	if err != nil {
		return nil, fmt.Errorf("ledger record %d in %s: %w", n, l.where, err)
	}
	if len(b) > storage.MaxLedgerRecord {
		return nil, fmt.Errorf("ledger record %d in %s: more than %d bytes: not a ledger record", n, l.where, storage.MaxLedgerRecord)
	}
	return b, nil
}
