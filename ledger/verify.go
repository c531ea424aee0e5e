package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Report is what Verify found.
type Report struct {
	// Entries are the entries the chain vouches for, in order: all of
	// them, or those before the first one removed or changed.
	Entries []Entry
	// Head is the hash of the newest record: write it down, and a later
	// --verify that finds another record at that number shows the
	// ledger's end was changed too (Verify's HeadAt).
	Head string
	// Problem is the first break of the chain, "" when it is whole.
	Problem string
	// At is the number of the first entry removed or changed (0: none).
	At uint64
}

// Verify checks records (a ledger read whole, in order): numbered 1, 2, …
// without a gap, each an entry of its own number, each naming the hash of
// the one before it. It reports the first entry that was removed or
// changed. The newest record has no successor to vouch for it: compare
// Head with one written down before (or with object lock, trust the
// store).
func Verify(records []storage.LedgerRecord) Report {
	var r Report
	var prev []byte
	next := uint64(1)
	for _, rec := range records {
		switch {
		case rec.Seq > next:
			r.fail(next, "entry %d is missing: removed from the ledger (the next one is %d)", next, rec.Seq)
			return r
		case rec.Seq < next:
			r.fail(rec.Seq, "entry %d appears twice", rec.Seq)
			return r
		}
		var e Entry
		dec := json.NewDecoder(bytes.NewReader(rec.Data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			r.fail(rec.Seq, "entry %d was changed: it is not a ledger entry (%v)", rec.Seq, err)
			return r
		}
		if e.Seq != rec.Seq {
			r.fail(rec.Seq, "entry %d was changed: it says it is entry %d", rec.Seq, e.Seq)
			return r
		}
		want := ""
		if prev != nil {
			want = Hash(prev)
		}
		if prev == nil && e.Prev != "" {
			r.fail(rec.Seq, "entry %d was changed: the first entry names a predecessor", rec.Seq)
			return r
		}
		if e.Prev != want {
			// Entry next-1's bytes are not the ones this entry chained to.
			r.Entries = r.Entries[:len(r.Entries)-1]
			r.fail(rec.Seq-1, "entry %d was changed: entry %d names SHA-256 %s for it, but it hashes to %s", rec.Seq-1, rec.Seq, short(e.Prev), short(want))
			return r
		}
		r.Entries = append(r.Entries, e)
		prev, next = rec.Data, rec.Seq+1
	}
	if prev != nil {
		r.Head = Hash(prev)
	}
	return r
}

func (r *Report) fail(at uint64, format string, args ...any) {
	r.At, r.Problem = at, fmt.Sprintf(format, args...)
}

func short(h string) string {
	if h == "" {
		return "(none)"
	}
	if len(h) > 16 {
		return h[:16] + "…"
	}
	return h
}
