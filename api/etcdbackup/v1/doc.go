// Package etcdbackupv1 is the etcdbackup.v1 API contract between the
// kubectl plugin, the agents and the data server: the messages and gRPC
// services generated from etcdbackup.proto (`make generate`), the few
// names the wire format fixes (compressions, encryptions, source kinds),
// the order listings come in (CompareListing), and the marks the server
// puts on its errors (ServerError, LocationUnavailableError).
package etcdbackupv1
