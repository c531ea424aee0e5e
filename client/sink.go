package client

import (
	"bufio"
	"fmt"
	"hash"
	"io"
	"sync"
)

// sinkDepth is how many received chunks (about 1 MiB each) may wait to be
// written and hashed: enough to ride out a slow write, little memory.
const sinkDepth = 8

// sinkWriteBytes is the size of the writes to the destination. A chunk
// arrives as HTTP/2 frames of 16 KiB each; written one by one, a GiB would
// cost 65536 write calls (and as many wake-ups of a reader on a pipe).
const sinkWriteBytes = 1 << 20

// sink writes received chunks to a writer and a hash on a goroutine of
// its own, so that hashing and writing overlap the network reads. Its
// owner calls close, which waits for the goroutine.
type sink struct {
	ch   chan *chunkMessage
	done chan struct{}

	mu      sync.Mutex
	failure error
}

func startSink(w io.Writer, sum hash.Hash, offset int64, progress func(int64)) *sink {
	s := &sink{ch: make(chan *chunkMessage, sinkDepth), done: make(chan struct{})}
	bw := bufio.NewWriterSize(w, sinkWriteBytes)
	go func() {
		defer close(s.done)
		// What was received is written, whatever ends the download: a
		// resumed download continues after it.
		defer func() {
			if err := bw.Flush(); err != nil && s.err() == nil {
				s.fail(fmt.Errorf("write before byte %d: %w", offset, err))
			}
		}()
		for m := range s.ch {
			if s.err() == nil {
				if err := m.writeTo(bw, sum); err != nil {
					s.fail(fmt.Errorf("write before byte %d: %w", offset, err))
				} else {
					offset += int64(m.n)
					if progress != nil {
						progress(offset)
					}
				}
			}
			// After a failure the rest is only released.
			m.free()
		}
	}()
	return s
}

// write queues m, which the sink frees; it returns the error of an
// earlier write, which ends the download.
func (s *sink) write(m *chunkMessage) error {
	if err := s.err(); err != nil {
		m.free()
		return err
	}
	s.ch <- m
	return nil
}

func (s *sink) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failure = err
}

func (s *sink) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// close waits until every queued chunk is written and returns the first
// write error.
func (s *sink) close() error {
	close(s.ch)
	<-s.done
	return s.err()
}
