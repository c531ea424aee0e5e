package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// metrics are the server's Prometheus series. With no registerer they are
// still counted, just not exported, so handlers need no nil checks.
type metrics struct {
	bytesIn   prometheus.Counter
	bytesOut  prometheus.Counter
	transfers *prometheus.HistogramVec
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
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.bytesIn, m.bytesOut, m.transfers} {
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
