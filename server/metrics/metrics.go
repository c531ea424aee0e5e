// Package metrics holds the data server's Prometheus series — transfers,
// agent runs, schedules, retention and storage failures — which the
// request handlers and the background controller update (storage
// failures: server/domain's locations, which every storage call passes).
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/status"
)

// Results of a backup run (etcdbackup_backup_runs_total's result label).
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
)

// Reasons a scheduled run was skipped.
const (
	SkipRunning = "running" // a backup of the target was still running
	SkipMissed  = "missed"  // its time was more than startingDeadline ago
	// SkipNameTaken: a backup not of this schedule had the run's name;
	// the run also counts as failed.
	SkipNameTaken = "name-taken"
)

// Metrics are the server's Prometheus series. With no registerer they are
// still counted, just not exported, so their users need no nil checks.
type Metrics struct {
	BytesIn   prometheus.Counter
	BytesOut  prometheus.Counter
	Transfers *prometheus.HistogramVec
	InFlight  *prometheus.GaugeVec

	// Agent runs, counted once when the server sees their Job finish.
	Runs        *prometheus.CounterVec
	LastSuccess *prometheus.GaugeVec
	Duration    *prometheus.HistogramVec
	Size        *prometheus.GaugeVec

	Period  *prometheus.GaugeVec
	Skipped *prometheus.CounterVec
	Pruned  *prometheus.CounterVec

	StorageErrors *prometheus.CounterVec

	// Restore drills, counted once when the server records their verdict.
	DrillRuns      *prometheus.CounterVec
	LastVerified   *prometheus.GaugeVec
	VerifiedWithin *prometheus.GaugeVec

	// ControllerLeader is 1 while this replica runs the controller (it
	// holds the Lease of server/leader, or runs without an election).
	ControllerLeader prometheus.Gauge

	// ConnectionsRefused counts connections to the agent and health
	// ports closed as soon as accepted: their source address already
	// held its share.
	ConnectionsRefused *prometheus.CounterVec

	// Delta capture (delta.go).
	deltaSeries
	// Copies to copy locations (copies.go).
	copySeries
}

// Results of a drill (etcdbackup_drill_runs_total's result label): its
// backup restored as recorded, did not, or the drill reached no verdict.
const (
	DrillSucceeded = "succeeded"
	DrillFailed    = "failed"
	DrillError     = "error"
)

// New makes the series and registers them with reg; nil registers none.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		BytesIn: counter("received_bytes_total",
			"Backup bytes received by uploads."),
		BytesOut: counter("sent_bytes_total",
			"Backup bytes sent by downloads."),
		Transfers: histogramVec("transfer_duration_seconds",
			"Duration of uploads and downloads, by direction and gRPC status code.",
			prometheus.ExponentialBuckets(0.01, 4, 10), "direction", "code"),
		InFlight: gaugeVec("transfers_in_flight",
			"Uploads and downloads in progress, by direction.", "direction"),
		ConnectionsRefused: counterVec("connections_refused_total",
			"Connections to the agent or health port (port label) closed as soon as accepted because their source address held its share of connections already: a flood, or an agent pod holding many.", "port"),
		Runs: counterVec("backup_runs_total",
			"Backup agent runs (scheduled and on demand) that finished, by target, location and result (succeeded, failed).", "target", "location", "result"),
		LastSuccess: gaugeVec("last_successful_backup_timestamp_seconds",
			"Unix time the newest stored agent backup of a target was taken, by target and location.", "target", "location"),
		Duration: histogramVec("backup_duration_seconds",
			"Duration of successful backup agent runs, from Job creation to completion, by target.",
			prometheus.ExponentialBuckets(5, 2, 12), "target"), // 5 s … ≈ 2.8 h
		Size: gaugeVec("backup_size_bytes",
			"Stored size of the last successful agent backup of a target.", "target"),
		Period: gaugeVec("backup_schedule_period_seconds",
			"The longest gap between two scheduled backups of a target: alerts allow a multiple of it.", "target"),
		Skipped: counterVec("scheduled_runs_skipped_total",
			"Scheduled backups not started, by target and reason (running: the previous one still ran; missed: later than startingDeadline; name-taken: another backup had the run's name).", "target", "reason"),
		Pruned: counterVec("pruned_backups_total",
			"Backups removed by retention, by target and location.", "target", "location"),
		StorageErrors: counterVec("storage_errors_total",
			"Storage operations that failed (not: not found, already exists, cancelled), by location and operation.", "location", "operation"),
		DrillRuns: counterVec("drill_runs_total",
			"Restore drills that finished, by target and result (succeeded: restored as recorded; failed: did not; error: no verdict).", "target", "result"),
		LastVerified: gaugeVec("last_verified_backup_timestamp_seconds",
			"Unix time the newest backup of a target that a restore drill verified was taken, by target and location.", "target", "location"),
		VerifiedWithin: gaugeVec("drill_verified_within_seconds",
			"How old a drilled target's newest verified backup may get before alerting (its drill.verifiedWithin), by target.", "target"),
		ControllerLeader: gauge("controller_leader",
			"1 on the replica that runs the controller (schedules, retention, drills, delta agents), 0 on the others."),
		deltaSeries: newDeltaSeries(),
		copySeries:  newCopySeries(),
	}
	for _, d := range []string{"upload", "download"} {
		m.InFlight.WithLabelValues(d)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.BytesIn, m.BytesOut, m.Transfers, m.InFlight, m.Runs, m.LastSuccess,
			m.Duration, m.Size, m.Period, m.Skipped, m.Pruned, m.StorageErrors, m.DrillRuns, m.LastVerified, m.VerifiedWithin, m.ControllerLeader, m.ConnectionsRefused} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
		for _, c := range append(m.deltaSeries.collectors(), m.copySeries.collectors()...) {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// ObserveTransfer records an upload's or a download's duration under
// the status code it ended with.
func (m *Metrics) ObserveTransfer(direction string, start time.Time, err error) {
	m.Transfers.WithLabelValues(direction, status.Code(err).String()).Observe(time.Since(start).Seconds())
}

// SetLastSuccess moves a target's last-success time forward, never back.
func (m *Metrics) SetLastSuccess(target, location string, t time.Time) {
	g := m.LastSuccess.WithLabelValues(target, location)
	if v := float64(t.UnixNano()) / 1e9; v > gaugeValue(g) {
		g.Set(v)
	}
}

// SetLastVerified moves a target's last-verified backup time forward,
// never back.
func (m *Metrics) SetLastVerified(target, location string, t time.Time) {
	g := m.LastVerified.WithLabelValues(target, location)
	if v := float64(t.UnixNano()) / 1e9; v > gaugeValue(g) {
		g.Set(v)
	}
}

// gaugeValue reads a gauge back.
func gaugeValue(g prometheus.Gauge) float64 {
	var d dto.Metric
	if err := g.Write(&d); err != nil {
		return 0
	}
	return d.GetGauge().GetValue()
}

// The series' constructors: every series is etcdbackup_NAME.

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
}

func histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
}

// namespace prefixes every series' name.
const namespace = "etcdbackup"
