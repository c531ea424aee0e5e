package readpath

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// A listing of more than one page is kept, sorted, for the pages after
// its first: each page would otherwise list the whole location again (a
// read of every manifest, on S3 a LIST request per 1,000 keys), so that
// listing n backups cost n²/page. The next pages of a kept listing show
// the location as it was at the first page, as a Kubernetes list's
// continue token does; a listing no longer kept (the server restarted,
// the page came too late, many listings at once) is listed again and
// resumes after the token's backup, as before.
const (
	// keptListings bounds the listings kept at once: a client reads its
	// pages back to back, so few are in flight.
	keptListings = 8
	// keptBackups bounds the backups they hold together (about 1 KiB
	// each): the server's memory, not the listings' number, is the
	// limit. A listing larger than that alone is not kept.
	keptBackups = 20_000
	// listingTTL is how long a kept listing waits for its next page.
	listingTTL = time.Minute
)

// pagedListings are the kept listings, by the ID their page tokens carry.
type pagedListings struct {
	mu   sync.Mutex
	kept map[string]*keptListing
}

// keptListing is a location's sorted listing, of key (listingKey: the
// selector and chain asked for).
type keptListing struct {
	location, key string
	sorted        []*ebv1.Backup
	expires       time.Time
}

// get returns the listing id keeps for location and key, and nil if none
// is kept (or it expired).
func (l *pagedListings) get(id, location, key string, now time.Time) []*ebv1.Backup {
	if id == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.kept[id]
	if k == nil || k.location != location || k.key != key {
		return nil
	}
	if now.After(k.expires) {
		delete(l.kept, id)
		return nil
	}
	k.expires = now.Add(listingTTL)
	return k.sorted
}

// keep keeps sorted under a new ID, which it returns, making room by
// dropping expired listings and then the one closest to expiring; "" if
// sorted is too large to keep.
func (l *pagedListings) keep(location, key string, sorted []*ebv1.Backup, now time.Time) string {
	if len(sorted) > keptBackups {
		return ""
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go 1.24)
	id := hex.EncodeToString(b[:])
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kept == nil {
		l.kept = map[string]*keptListing{}
	}
	for kid, k := range l.kept {
		if now.After(k.expires) {
			delete(l.kept, kid)
		}
	}
	held := func() int {
		n := 0
		for _, k := range l.kept {
			n += len(k.sorted)
		}
		return n
	}
	for len(l.kept) >= keptListings || len(l.kept) > 0 && held()+len(sorted) > keptBackups {
		var oldest string
		for kid, k := range l.kept {
			if oldest == "" || k.expires.Before(l.kept[oldest].expires) {
				oldest = kid
			}
		}
		delete(l.kept, oldest)
	}
	l.kept[id] = &keptListing{location: location, key: key, sorted: sorted, expires: now.Add(listingTTL)}
	return id
}

// done forgets listing id: its last page was sent.
func (l *pagedListings) done(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.kept, id)
}
