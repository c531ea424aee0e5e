package plugin

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress draws a progress bar on a terminal and nothing elsewhere, so
// that scripts and logs stay clean. A nil *progress is valid and silent.
type progress struct {
	bar *progressbar.ProgressBar
}

func newProgress(w io.Writer, total int64, what string) *progress {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return &progress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)}
}

// Set moves the bar to n bytes.
func (p *progress) Set(n int64) {
	if p == nil {
		return
	}
	_ = p.bar.Set64(n)
}

// Finish removes the bar.
func (p *progress) Finish(ok bool) {
	if p == nil {
		return
	}
	if ok {
		_ = p.bar.Finish()
	}
	_ = p.bar.Clear()
	_ = p.bar.Exit()
}
