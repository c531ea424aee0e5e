// Package domain is what the data server's request layer (server/rpc,
// server/rpc/readpath) and its background controller (server/controller)
// share below gRPC: the configured storage locations as one set with its
// default (Locations, built once), every call to them counted when it
// fails, the configured etcd targets with theirs (Targets), one round's
// listings of the locations (Listings), and the typed errors of resolving
// and starting things. It knows nothing of gRPC: the request layer turns
// these errors into statuses at its edge, the controller decides on them
// with errors.Is and errors.As.
package domain
