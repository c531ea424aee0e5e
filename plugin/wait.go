package plugin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/wait"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
)

// WaitOptions are --wait and --timeout of the commands that start work in
// the cluster (backup, drill, restore --target), and how often the wait
// asks the server.
type WaitOptions struct {
	Wait bool
	// WaitTimeout bounds --wait (--timeout); PollInterval is how often it
	// asks.
	WaitTimeout  time.Duration
	PollInterval time.Duration
}

// defaultWait waits up to an hour, asking every second.
func defaultWait() WaitOptions { return WaitOptions{WaitTimeout: time.Hour, PollInterval: time.Second} }

// addFlags adds --wait, saying what it waits for, and --timeout.
func (w *WaitOptions) addFlags(f *pflag.FlagSet, waitsFor string) {
	f.BoolVar(&w.Wait, "wait", false, waitsFor)
	f.DurationVar(&w.WaitTimeout, "timeout", w.WaitTimeout, "how long --wait waits")
}

// stillRunning is the error of a --wait that ended before the run it
// waits for: what is still running, for how long it was waited on, and
// next, what to do. An interrupted wait (ctx ended: Ctrl-C) says so
// rather than blaming --timeout, which it may be far from.
func stillRunning(ctx context.Context, began time.Time, what, next string) error {
	waited := time.Since(began).Round(time.Second)
	if ctx.Err() != nil {
		return fmt.Errorf("stopped waiting after %s: %s is still running in the cluster; %s", waited, what, next)
	}
	return fmt.Errorf("%s is still running after %s (--timeout); %s", what, waited, next)
}

// pollTimeout bounds one poll of --wait: a poll that hangs on a dead
// connection fails and is retried like a broken one.
const pollTimeout = 30 * time.Second

// pollServer is the loop of --wait: it asks the server every interval
// (at once too, when immediate) until seen says the wait is over or
// fails, or timeout passes (an error for which wait.Interrupted is true).
// Each ask is bounded by pollTimeout; one that fails transiently (the
// server pod replaced) is asked again at the next poll, for
// --retry-timeout without an answer; any other failure ends the wait,
// explained as op.
func pollServer[T any](ctx context.Context, conn *Connection, op string, interval, timeout time.Duration, immediate bool,
	ask func(context.Context) (T, error), seen func(T) (done bool, err error)) error {
	retry := conn.NewRetrier(func() string { return op })
	return wait.PollUntilContextTimeout(ctx, interval, timeout, immediate, func(ctx context.Context) (bool, error) {
		pctx, cancel := context.WithTimeout(ctx, pollTimeout)
		resp, err := ask(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				// The deadline, not the server: report it as the timeout.
				return false, ctx.Err()
			}
			if err := retry.Check(ctx, err); err != nil {
				return false, conn.explain(op, err)
			}
			return false, nil // a transient failure: ask again at the next poll
		}
		retry.Progress()
		return seen(resp)
	})
}

// logTail is how many of the agent's last log lines a failure shows.
const logTail = 10

// printLogTail writes the last logTail lines of an agent's log (or of
// its last words) under a heading; nothing when there are none.
func printLogTail(w io.Writer, log string) {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return
	}
	if len(lines) > logTail {
		lines = lines[len(lines)-logTail:]
	}
	fmt.Fprintf(w, "last lines of the agent's log:\n")
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// printLastLogLines writes the last lines of the agent's log of a failed
// backup, best effort: the failure itself is the error to report.
func printLastLogLines(ctx context.Context, w io.Writer, conn *Connection, b *ebv1.Backup) {
	stream, err := conn.Backups.GetBackupLogs(ctx, &ebv1.GetBackupLogsRequest{Name: b.GetName(), Location: b.GetLocation()})
	if err != nil {
		return
	}
	var buf bytes.Buffer
	for {
		msg, err := stream.Recv()
		if err != nil {
			break
		}
		buf.Write(msg.GetData())
	}
	printLogTail(w, buf.String())
}
