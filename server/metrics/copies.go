package metrics

import "github.com/prometheus/client_golang/prometheus"

// copySeries are the series of copies to copy locations, each by the
// location copied from (location) and the copy location (copy).
type copySeries struct {
	// CopyLag is how long the oldest object not yet copied has waited.
	CopyLag *prometheus.GaugeVec
	// CopiesPending counts the objects not yet copied.
	CopiesPending *prometheus.GaugeVec
	// CopyFailures counts failed attempts to copy an object.
	CopyFailures *prometheus.CounterVec
	// Copied counts objects copied, CopiedBytes their stored bytes.
	Copied      *prometheus.CounterVec
	CopiedBytes *prometheus.CounterVec
}

func newCopySeries() copySeries {
	return copySeries{
		CopyLag: gaugeVec("copy_lag_seconds",
			"Seconds since the oldest backup, delta segment or recovery kit stored in a location and not yet in its copy location was stored (0: every one is copied), by location and copy location.", "location", "copy"),
		CopiesPending: gaugeVec("copies_pending",
			"Backups, delta segments and recovery kits stored in a location and not yet in its copy location, by location and copy location.", "location", "copy"),
		CopyFailures: counterVec("copy_failures_total",
			"Attempts to copy a backup, delta segment or recovery kit to a copy location that failed (retried with backoff), by location and copy location.", "location", "copy"),
		Copied: counterVec("copies_total",
			"Backups, delta segments and recovery kits copied to a copy location, their SHA-256 checked, by location and copy location.", "location", "copy"),
		CopiedBytes: counterVec("copied_bytes_total",
			"Stored bytes copied to copy locations, by location and copy location.", "location", "copy"),
	}
}

func (c copySeries) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.CopyLag, c.CopiesPending, c.CopyFailures, c.Copied, c.CopiedBytes}
}
