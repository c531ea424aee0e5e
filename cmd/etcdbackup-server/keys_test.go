package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log both the loop and the test use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// One loop follows both keys: each tick refreshes each, a change is
// logged every time, an error once a minute per key, and the loop ends
// with its context.
func TestFollowKeys(t *testing.T) {
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	// Each refresh answers from its queue, and says it was called.
	type answer struct {
		changed bool
		err     error
	}
	called := make(chan string)
	key := func(name string, answers ...answer) followedKey {
		return followedKey{what: name, changed: name + " changed", refresh: func(context.Context) (bool, error) {
			a := answers[0]
			answers = answers[1:]
			called <- name
			return a.changed, a.err
		}}
	}
	broken := errors.New("secrets is forbidden")
	ctx, cancel := context.WithCancel(context.Background())
	ticks := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		followKeys(ctx, ticks, log, "etcdbackup",
			key("signing", answer{}, answer{changed: true}, answer{changed: true}),
			key("ca", answer{err: broken}, answer{err: broken}, answer{changed: true}))
	}()
	for range 3 {
		ticks <- time.Now()
		if a, b := <-called, <-called; a != "signing" || b != "ca" {
			t.Fatalf("a tick refreshed %s then %s; want signing, then ca", a, b)
		}
	}
	cancel()
	<-done
	log2 := out.String()
	if n := strings.Count(log2, "signing changed"); n != 2 {
		t.Errorf("the signing key's 2 changes are logged %d times:\n%s", n, log2)
	}
	if n := strings.Count(log2, "cannot read ca again"); n != 1 || !strings.Contains(log2, broken.Error()) {
		t.Errorf("the CA's 2 failures within a minute are logged %d times (want once, with the error):\n%s", n, log2)
	}
	if !strings.Contains(log2, "ca changed") {
		t.Errorf("the CA's change is not logged:\n%s", log2)
	}
}
