// Package backup is the backup agent: it streams Maintenance.Snapshot from
// one etcd member through optional zstd compression, then optional age
// encryption to public keys (package crypt), into the data server's upload
// RPC. etcd's own SHA-256 trailer is checked on the way: by the agent when
// the snapshot is compressed or encrypted, else by the server. Nothing is
// written to disk and nothing holds the whole snapshot: memory stays flat
// whatever the database size. A snapshot stored as is goes from etcd's
// messages to the upload without being copied (relay). If the stream is
// short, the trailer wrong or etcd goes away, the upload is aborted and the
// server stores nothing.
package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"filippo.io/age"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/types/known/timestamppb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// Options say what to back up and where to.
type Options struct {
	// Endpoint is the one etcd member to snapshot.
	Endpoint string
	// Name, Location and Labels of the backup on the server.
	Name     string
	Location string
	Labels   map[string]string
	// Target is the name of the etcd target in the server's config, recorded
	// in the backup's source.
	Target string
	// Compression is one of ebv1.Compressions.
	Compression string
	// AgeRecipients, when set, are the age public keys the backup is
	// encrypted to, after compression, before it leaves the agent.
	AgeRecipients []string
	// Progress, if set, is called with the raw snapshot bytes read so far,
	// from the goroutine that reads the snapshot.
	Progress func(n int64)
	// ScratchDir holds a copy of the plain snapshot while it streams, from
	// which its status (revision, keys, hash, bolt's check) is read at the
	// end and recorded with the backup; "" reads none.
	ScratchDir string
}

// readAheadBuffers is how many upload chunks the snapshot is read ahead of
// the upload: enough to keep both sides busy, 4 MiB at most.
const readAheadBuffers = 4

// Run snapshots the member at opts.Endpoint through etcd and uploads it
// through up. etcd must be a client connected to that endpoint only.
func Run(ctx context.Context, etcd *clientv3.Client, up *client.Client, opts Options) (*ebv1.Backup, error) {
	if err := ebv1.ValidateCompression(opts.Compression); err != nil {
		return nil, err
	}
	var recipients []age.Recipient
	if len(opts.AgeRecipients) > 0 {
		var err error
		if recipients, err = crypt.ParseRecipients(opts.AgeRecipients); err != nil {
			return nil, fmt.Errorf("encryption: %w", err)
		}
	}
	start := time.Now()
	info, err := memberInfo(ctx, etcd, opts.Endpoint)
	if err != nil {
		return nil, err
	}

	// The snapshot stream and the upload share ctx: when either fails, the
	// other is cancelled.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	status, err := newStatusCopy(ctx, opts.ScratchDir, etcd, opts.Endpoint)
	if err != nil {
		return nil, err
	}
	defer status.Remove()
	req := uploadRequest(opts, info, start)
	if opts.Compression == ebv1.CompressionNone && len(recipients) == 0 {
		return relaySnapshot(ctx, etcd, up, opts, info, req, status)
	}
	return encodeSnapshot(ctx, etcd, up, opts, info, req, status, recipients)
}

// memberInfo is what the backup records of the etcd member at endpoint,
// asked before the snapshot starts.
func memberInfo(ctx context.Context, etcd *clientv3.Client, endpoint string) (*ebv1.EtcdInfo, error) {
	st, err := etcd.Status(ctx, endpoint)
	if err != nil {
		return nil, fmt.Errorf("status of etcd member %s: %w", endpoint, err)
	}
	info := &ebv1.EtcdInfo{
		// etcd does not say which revision a snapshot holds; the member's
		// revision just before it is the best lower bound there is.
		Revision:  st.Header.GetRevision(),
		ClusterId: st.Header.GetClusterId(),
		MemberId:  st.Header.GetMemberId(),
		Version:   st.Version,
		DbSize:    st.DbSize,
	}
	if members, err := etcd.MemberList(ctx); err == nil {
		for _, m := range members.Members {
			if m.ID == info.MemberId {
				info.MemberName = m.Name
			}
		}
	}
	return info, nil
}

// uploadRequest is the upload of the backup opts describe, taken by an
// agent from start on, of the member info describes (updated in place
// when the snapshot says more), not encrypted.
func uploadRequest(opts Options, info *ebv1.EtcdInfo, start time.Time) client.UploadRequest {
	return client.UploadRequest{Header: &ebv1.UploadHeader{
		Name:          opts.Name,
		Location:      opts.Location,
		Labels:        opts.Labels,
		Compression:   opts.Compression,
		Encryption:    ebv1.EncryptionNone,
		AgeRecipients: opts.AgeRecipients,
		Etcd:          info,
		Source: &ebv1.BackupSource{
			Kind:      ebv1.SourceAgent,
			Target:    opts.Target,
			StartTime: timestamppb.New(start),
		},
	}}
}

// encodeSnapshot uploads the snapshot compressed, encrypted to
// recipients, or both. The server cannot see etcd's trailer then: the
// agent checks it (the verifier's hash, carried on through the trailer,
// is the raw SHA-256 the server records) and the stored bytes are hashed
// by the read-ahead, off the sending goroutine.
func encodeSnapshot(ctx context.Context, etcd *clientv3.Client, up *client.Client, opts Options, info *ebv1.EtcdInfo, req client.UploadRequest, status *statusCopy, recipients []age.Recipient) (*ebv1.Backup, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	snap, err := startRelay(ctx, etcd, client.ChunkBytes, nil)
	if err != nil {
		return nil, fmt.Errorf("start snapshot of etcd member %s: %w", opts.Endpoint, err)
	}
	// Deferred first, so it runs after the read-ahead has stopped reading.
	defer snap.Close()
	if snap.Version != "" {
		info.Version = snap.Version
	}
	var plainSnap io.Reader = snap
	if status != nil {
		plainSnap = io.TeeReader(snap, status)
		req.Etcd = status.Status
	}

	raw := snapshot.NewVerifier(plainSnap, snapshot.VerifierOptions{Progress: opts.Progress, HashWhole: true})
	compressed, err := snapshot.Compress(ctx, raw, opts.Compression)
	if err != nil {
		return nil, err
	}
	// Unblocks the encoder goroutine if the upload stops reading.
	defer compressed.Close()
	var body io.Reader = compressed
	if recipients != nil {
		if body, err = crypt.Encrypt(ctx, compressed, recipients); err != nil {
			return nil, fmt.Errorf("encryption: %w", err)
		}
		req.Header.Encryption = ebv1.EncryptionAge
	}
	sum := sha256.New()
	req.SHA256 = func() string { return hex.EncodeToString(sum.Sum(nil)) }
	req.Raw = func() (int64, string) { return raw.Size(), raw.SHA256() }
	ahead := newReadAhead(ctx, body, sum, readAheadBuffers, client.ChunkBytes)
	defer func() {
		cancel() // ends a read of etcd's stream the read-ahead may be in
		ahead.Close()
	}()
	b, err := up.UploadWith(ctx, ahead, req)
	if err != nil {
		cancel()
		ahead.Close()
		if verr := ahead.sourceErr(); verr != nil && !errors.Is(verr, context.Canceled) {
			return nil, fmt.Errorf("snapshot of etcd member %s: %w (nothing was stored)", opts.Endpoint, verr)
		}
		return nil, fmt.Errorf("upload snapshot %q: %w", opts.Name, err)
	}
	return b, nil
}

// relaySnapshot uploads the snapshot as etcd sends it, stored as is. It
// is not hashed here at all: the server checks etcd's SHA-256 trailer in
// the one pass that hashes what it stores (snapshot.TrailerCheck), and
// stores nothing if it fails.
func relaySnapshot(ctx context.Context, etcd *clientv3.Client, up *client.Client, opts Options, info *ebv1.EtcdInfo, req client.UploadRequest, status *statusCopy) (*ebv1.Backup, error) {
	r, err := startRelay(ctx, etcd, client.ChunkBytes, opts.Progress)
	if err != nil {
		return nil, fmt.Errorf("start snapshot of etcd member %s: %w", opts.Endpoint, err)
	}
	defer r.Close()
	if r.Version != "" {
		info.Version = r.Version
	}
	// The server hashes what arrives and checks etcd's trailer.
	req.SHA256 = func() string { return "" }
	next := r.Next
	if status != nil {
		next = func() (mem.BufferSlice, error) {
			chunk, err := r.Next()
			if err == nil {
				if werr := status.writeBuffers(chunk); werr != nil {
					chunk.Free()
					return nil, werr
				}
			}
			return chunk, err
		}
		req.Etcd = status.Status
	}
	b, err := up.UploadChunks(ctx, next, req)
	if err != nil {
		if r.err != nil && !errors.Is(r.err, context.Canceled) {
			return nil, fmt.Errorf("snapshot of etcd member %s: %w (nothing was stored)", opts.Endpoint, r.err)
		}
		return nil, fmt.Errorf("upload snapshot %q: %w", opts.Name, err)
	}
	return b, nil
}
