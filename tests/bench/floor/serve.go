package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/bench/floor/rawcodec"
)

// store is where serve keeps what it receives.
type store interface {
	// create returns where name's bytes go and what makes them durable.
	create(ctx context.Context, name string) (upload, error)
	// open returns name's bytes.
	open(ctx context.Context, name string) (io.ReadCloser, error)
}

type upload interface {
	io.Writer
	commit() error
	abort()
}

// runServe serves the floor's upload and download streams until ctx ends.
func runServe(ctx context.Context, args []string) error {
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fl.String("listen", "127.0.0.1:0", "the address to listen on")
	dir := fl.String("dir", "", "the directory backups are stored in")
	var s3 s3Flags
	fl.StringVar(&s3.bucket, "s3-bucket", "", "the S3 bucket backups are stored in, instead of -dir")
	fl.StringVar(&s3.region, "s3-region", "us-east-1", "the bucket's region")
	fl.StringVar(&s3.endpoint, "s3-endpoint", "", "the S3 endpoint, https://HOST:PORT (path-style addressing)")
	fl.StringVar(&s3.caFile, "s3-ca", "", "the PEM file of the CA the endpoint's certificate is from")
	fl.StringVar(&s3.keyIDFile, "s3-access-key-id-file", "", "the file holding the access key ID")
	fl.StringVar(&s3.secretFile, "s3-secret-access-key-file", "", "the file holding the secret access key")
	fl.StringVar(&s3.prefix, "s3-prefix", "floor/", "what every key starts with")
	fl.IntVar(&s3.partMiB, "s3-part-mib", 5, "the multipart part size in MiB (the product's default)")
	fl.IntVar(&s3.concurrency, "s3-concurrency", 2, "how many parts are sent at once (the product's default)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	var st store
	switch {
	case *dir != "" && s3.bucket == "":
		st = dirStore(*dir)
	case *dir == "" && s3.bucket != "":
		var err error
		if st, err = newS3Store(s3); err != nil {
			return err
		}
	default:
		return errors.New("serve: one of -dir and -s3-bucket is required")
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawcodec.Codec{}), experimental.BufferPool(buffers), grpc.MaxRecvMsgSize(maxMessageBytes))
	streams := append([]grpc.StreamDesc(nil), rawcodec.Streams...)
	streams[0].Handler = func(_ any, ss grpc.ServerStream) error { return receive(ss, st) }
	streams[1].Handler = func(_ any, ss grpc.ServerStream) error { return serveBytes(ss, st) }
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: rawcodec.Service, HandlerType: (*any)(nil), Streams: streams}, nil)
	fmt.Println(lis.Addr())

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		<-served
		return nil
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
}

// receive stores one upload: its name, then its bytes, each hashed once
// and written once; made durable at the end.
func receive(ss grpc.ServerStream, st store) error {
	var name []byte
	if err := ss.RecvMsg(&name); err != nil {
		return err
	}
	up, err := st.create(ss.Context(), string(name))
	if err != nil {
		return status.Errorf(codes.Internal, "create %q: %v", name, err)
	}
	sum := sha256.New()
	var size int64
	buf := make([]byte, 0, uploadChunkBytes)
	for {
		err := ss.RecvMsg(&buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			up.abort()
			return err
		}
		sum.Write(buf)
		if _, err := up.Write(buf); err != nil {
			up.abort()
			return status.Errorf(codes.Internal, "write %q: %v", name, err)
		}
		size += int64(len(buf))
	}
	if err := up.commit(); err != nil {
		return status.Errorf(codes.Internal, "store %q: %v", name, err)
	}
	return ss.SendMsg(fmt.Appendf(nil, "%d %x", size, sum.Sum(nil)))
}

// serveBytes sends the bytes of the backup a download names, each chunk
// read into a pooled buffer that gRPC frees once it has written it.
func serveBytes(ss grpc.ServerStream, st store) error {
	var name []byte
	if err := ss.RecvMsg(&name); err != nil {
		return err
	}
	r, err := st.open(ss.Context(), string(name))
	if err != nil {
		return status.Errorf(codes.NotFound, "open %q: %v", name, err)
	}
	defer r.Close()
	for {
		bp := buffers.Get(downloadChunkBytes)
		n, rerr := io.ReadFull(r, *bp)
		if n > 0 {
			*bp = (*bp)[:n]
			b := mem.NewBuffer(bp, buffers)
			err := ss.SendMsg(mem.BufferSlice{b})
			b.Free()
			if err != nil {
				return err
			}
		} else {
			buffers.Put(bp)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return nil
		}
		if rerr != nil {
			return status.Errorf(codes.Internal, "read %q: %v", name, rerr)
		}
	}
}

// dirStore keeps each backup as DIR/NAME.db.
type dirStore string

func (d dirStore) path(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || name[0] == '.' {
		return "", fmt.Errorf("bad name %q", name)
	}
	return filepath.Join(string(d), name+".db"), nil
}

func (d dirStore) create(_ context.Context, name string) (upload, error) {
	p, err := d.path(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(p)
	if err != nil {
		return nil, err
	}
	return fileUpload{f}, nil
}

func (d dirStore) open(_ context.Context, name string) (io.ReadCloser, error) {
	p, err := d.path(name)
	if err != nil {
		return nil, err
	}
	return os.Open(p)
}

// fileUpload is one file written in full, then fsynced once: what the
// product's filesystem location must do before it may say a backup is
// stored.
type fileUpload struct{ *os.File }

func (u fileUpload) commit() error {
	if err := u.Sync(); err != nil {
		u.Close()
		return fmt.Errorf("fsync: %w", err)
	}
	return u.Close()
}

func (u fileUpload) abort() {
	u.Close()
	os.Remove(u.Name())
}
