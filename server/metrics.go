package server

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// Results of a backup run (etcdbackup_backup_runs_total's result label).
const (
	resultSucceeded = "succeeded"
	resultFailed    = "failed"
)

// Reasons a scheduled run was skipped.
const (
	skipRunning = "running" // a backup of the target was still running
	skipMissed  = "missed"  // its time was more than startingDeadline ago
)

// metrics are the server's Prometheus series. With no registerer they are
// still counted, just not exported, so handlers need no nil checks.
type metrics struct {
	bytesIn   prometheus.Counter
	bytesOut  prometheus.Counter
	transfers *prometheus.HistogramVec
	inFlight  *prometheus.GaugeVec

	// Agent runs, counted once when the server sees their Job finish.
	runs        *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
	duration    *prometheus.HistogramVec
	size        *prometheus.GaugeVec

	period  *prometheus.GaugeVec
	skipped *prometheus.CounterVec
	pruned  *prometheus.CounterVec

	storageErrors *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "etcdbackup", Name: "received_bytes_total",
			Help: "Backup bytes received by uploads.",
		}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "etcdbackup", Name: "sent_bytes_total",
			Help: "Backup bytes sent by downloads.",
		}),
		transfers: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "etcdbackup", Name: "transfer_duration_seconds",
			Help:    "Duration of uploads and downloads, by direction and gRPC status code.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}, []string{"direction", "code"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "etcdbackup", Name: "transfers_in_flight",
			Help: "Uploads and downloads in progress, by direction.",
		}, []string{"direction"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "etcdbackup", Name: "backup_runs_total",
			Help: "Backup agent runs (scheduled and on demand) that finished, by target, location and result (succeeded, failed).",
		}, []string{"target", "location", "result"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "etcdbackup", Name: "last_successful_backup_timestamp_seconds",
			Help: "Unix time the newest stored agent backup of a target was taken, by target and location.",
		}, []string{"target", "location"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "etcdbackup", Name: "backup_duration_seconds",
			Help:    "Duration of successful backup agent runs, from Job creation to completion, by target.",
			Buckets: prometheus.ExponentialBuckets(5, 2, 12), // 5 s … ≈ 2.8 h
		}, []string{"target"}),
		size: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "etcdbackup", Name: "backup_size_bytes",
			Help: "Stored size of the last successful agent backup of a target.",
		}, []string{"target"}),
		period: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "etcdbackup", Name: "backup_schedule_period_seconds",
			Help: "The longest gap between two scheduled backups of a target: alerts allow a multiple of it.",
		}, []string{"target"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "etcdbackup", Name: "scheduled_runs_skipped_total",
			Help: "Scheduled backups not started, by target and reason (running: the previous one still ran; missed: later than startingDeadline).",
		}, []string{"target", "reason"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "etcdbackup", Name: "pruned_backups_total",
			Help: "Backups removed by retention, by target and location.",
		}, []string{"target", "location"}),
		storageErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "etcdbackup", Name: "storage_errors_total",
			Help: "Storage operations that failed (not: not found, already exists, cancelled), by location and operation.",
		}, []string{"location", "operation"}),
	}
	for _, d := range []string{"upload", "download"} {
		m.inFlight.WithLabelValues(d)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.bytesIn, m.bytesOut, m.transfers, m.inFlight, m.runs, m.lastSuccess,
			m.duration, m.size, m.period, m.skipped, m.pruned, m.storageErrors} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) observeTransfer(direction string, start time.Time, err error) {
	m.transfers.WithLabelValues(direction, status.Code(err).String()).Observe(time.Since(start).Seconds())
}

// setLastSuccess moves a target's last-success time forward, never back.
func (m *metrics) setLastSuccess(target, location string, t time.Time) {
	g := m.lastSuccess.WithLabelValues(target, location)
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

// storageError is the package's storageError, counting in
// etcdbackup_storage_errors_total what is the storage's fault: not a
// missing or existing backup, nor a caller that went away.
func (s *Server) storageError(op, loc, name string, err error) error {
	if !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrAlreadyExists) && !errors.Is(err, context.Canceled) {
		s.metrics.storageErrors.WithLabelValues(loc, op).Inc()
	}
	return storageError(op, loc, name, err)
}
