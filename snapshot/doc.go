// Package snapshot owns etcd snapshot files and streams, and nothing else:
// it checks etcd's own SHA-256 trailer while a snapshot streams by
// (Verifier), undoes and applies the backups' compression, turns a stored
// backup — compressed, age-encrypted (through package crypt) — back into
// a verified plain snapshot (WritePlain, Unpack), checks a
// snapshot file's bolt database (Check) and rebuilds a member's data
// directory with etcd's own restore code (Restore, from
// go.etcd.io/etcd/etcdutl/v3/snapshot). It has no network code: the
// agents, the server's verify and the plugin feed it bytes they read
// themselves, a stored backup's through package fetch.
package snapshot

import "errors"

// ErrCorrupt reports a snapshot that is not what it claims to be: etcd's
// trailer, the compression stream or the database's own structure is
// wrong.
var ErrCorrupt = errors.New("the etcd snapshot is corrupt")
