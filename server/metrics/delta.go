package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// deltaSeries are the delta capture's series.
type deltaSeries struct {
	Segments *prometheus.CounterVec
	Bytes    *prometheus.CounterVec
	Events   *prometheus.CounterVec
	// ChainEnds counts chains that ended (etcd compacted past the agent,
	// a revision missing), by target.
	ChainEnds   *prometheus.CounterVec
	DeltaPeriod *prometheus.GaugeVec
	// ClockOffset is the server's clock minus the delta agent's, as its
	// newest segment arrived: the agent's clock stamps every revision.
	ClockOffset *prometheus.GaugeVec
	lag         *lagCollector
}

func newDeltaSeries() deltaSeries {
	return deltaSeries{
		Segments: counterVec("delta_segments_total",
			"Delta segments stored, by target.", "target"),
		Bytes: counterVec("delta_bytes_total",
			"Stored bytes of delta segments (compressed, encrypted), by target.", "target"),
		Events: counterVec("delta_events_total",
			"etcd events stored in delta segments, by target.", "target"),
		ChainEnds: counterVec("delta_chain_ends_total",
			"Delta chains that ended before a new full backup replaced them (etcd compacted past the agent, a revision was missing), by target: each starts a full backup.", "target"),
		DeltaPeriod: gaugeVec("delta_period_seconds",
			"A target's deltas.period: the lag alert allows a multiple of it.", "target"),
		ClockOffset: gaugeVec("delta_clock_offset_seconds",
			"The data server's clock minus the delta agent's when its newest segment arrived, by target (upload transit included). "+
				"The agent's clock stamps the time of every revision a restore to a time goes by: more than a second off moves writes across a point.", "target"),
		lag: &lagCollector{last: map[string]time.Time{}, now: time.Now, desc: prometheus.NewDesc("etcdbackup_delta_lag_seconds",
			"Seconds since the newest etcd event stored in a delta segment of a target was seen: how much a restore to now would lose. "+
				"It grows when the agent stops storing, and also when etcd takes no writes (a Kubernetes cluster writes every few seconds).",
			[]string{"target"}, nil)},
	}
}

func (d deltaSeries) collectors() []prometheus.Collector {
	return []prometheus.Collector{d.Segments, d.Bytes, d.Events, d.ChainEnds, d.DeltaPeriod, d.ClockOffset, d.lag}
}

// DeltaStored counts a stored segment of target, of size bytes, whose
// newest event was seen at last.
func (m *Metrics) DeltaStored(target string, size int64, last time.Time, events int64) {
	m.Segments.WithLabelValues(target).Inc()
	m.Bytes.WithLabelValues(target).Add(float64(size))
	m.Events.WithLabelValues(target).Add(float64(events))
	if !last.IsZero() {
		m.lag.observe(target, last)
	}
}

// SetDeltaPosition records the newest event stored for target, as read
// from storage (at start, or when a new chain begins).
func (m *Metrics) SetDeltaPosition(target string, last time.Time) {
	if !last.IsZero() {
		m.lag.observe(target, last)
	}
}

// lagCollector exports etcdbackup_delta_lag_seconds, computed when
// scraped.
type lagCollector struct {
	mu   sync.Mutex
	last map[string]time.Time
	now  func() time.Time
	desc *prometheus.Desc
}

func (c *lagCollector) observe(target string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.last[target]) {
		c.last[target] = t
	}
}

func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for target, t := range c.last {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, now.Sub(t).Seconds(), target)
	}
}
