package ctxio

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReaderStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := NewReader(ctx, strings.NewReader("abcdef"))
	buf := make([]byte, 3)
	if n, err := r.Read(buf); n != 3 || err != nil {
		t.Fatalf("before cancel: %d %v", n, err)
	}
	cancel()
	if _, err := r.Read(buf); !errors.Is(err, context.Canceled) {
		t.Fatalf("after cancel: %v", err)
	}
}

func TestRecorderKeepsTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	rec := &Recorder{R: io.MultiReader(strings.NewReader("ab"), errReader{boom})}
	if _, err := io.ReadAll(rec); !errors.Is(err, boom) || !errors.Is(rec.Err, boom) {
		t.Fatalf("got %v, recorded %v", err, rec.Err)
	}
	rec = &Recorder{R: strings.NewReader("ab")}
	io.ReadAll(rec)
	if rec.Err != io.EOF {
		t.Fatalf("recorded %v, want io.EOF", rec.Err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
