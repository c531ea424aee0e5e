// Package etcdbackupv1 is the etcdbackup.v1 API contract between the
// kubectl plugin, the agents and the data server: the messages and gRPC
// services generated from etcdbackup.proto (`make generate`), and the few
// names the wire format fixes (Compressions).
package etcdbackupv1
