package schedule

import (
	"strconv"
	"strings"
	"time"
)

// The backups a target's delta capture takes are the server's too, and
// named by it: a full to start a new chain from (ChainName) and a chain
// folded into a full (FoldName). Retention counts them with the
// scheduled ones; no user may take such a name (Automatic).
const (
	// KindScheduled, KindChain and KindFold say which of the server's
	// own names a backup has.
	KindScheduled = "scheduled"
	KindChain     = "chain base"
	KindFold      = "fold"
)

// ChainName is the name of the full backup of target, started at t, that
// a new delta chain starts from.
func ChainName(target string, t time.Time) string {
	return target + "-chain-" + t.UTC().Format(nameLayout)
}

// FoldName is the name of the full backup a fold of target's chain to
// revision stores.
func FoldName(target string, revision int64) string {
	return target + "-fold-" + strconv.FormatInt(revision, 10)
}

// Automatic says which of the names the server gives target's own
// backups name has: KindScheduled (Name, AltName), KindChain (ChainName)
// or KindFold (FoldName); ok is false for any other name.
func Automatic(target, name string) (kind string, ok bool) {
	if Reserved(target, name) {
		return KindScheduled, true
	}
	rest, ok := strings.CutPrefix(name, target+"-")
	if !ok {
		return "", false
	}
	if at, ok := strings.CutPrefix(rest, "chain-"); ok {
		if _, err := time.ParseInLocation(nameLayout, at, time.UTC); err == nil {
			return KindChain, true
		}
	}
	if rev, ok := strings.CutPrefix(rest, "fold-"); ok && rev != "" && strings.Trim(rev, "0123456789") == "" {
		return KindFold, true
	}
	return "", false
}
