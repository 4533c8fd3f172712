package branches

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descLagBytes = prometheus.NewDesc("pgfork_branch_source_lag_bytes",
		"WAL a standby source's primary wrote that the standby has not replayed yet.", []string{"source"}, nil)
	descLagSeconds = prometheus.NewDesc("pgfork_branch_source_lag_seconds",
		"How long a standby source is behind its primary (age of its last replayed transaction while behind, 0 once caught up).",
		[]string{"source"}, nil)
	descStreaming = prometheus.NewDesc("pgfork_branch_source_streaming",
		"1 while a standby source streams from its primary, 0 when it has not for longer than a short grace period or cannot be reached.",
		[]string{"source"}, nil)
)

// Collector exports each standby source's lag (StandbyLag), measured at
// scrape time (a standby whose lag is unknown is left out), and whether it
// streams from its primary (every standby source).
func (m *Manager) Collector() prometheus.Collector { return lagCollector{m} }

type lagCollector struct{ m *Manager }

func (c lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLagBytes
	ch <- descLagSeconds
	ch <- descStreaming
}

func (c lagCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.m.sourcesWithLag(context.Background()) {
		if s.Lag == nil {
			continue
		}
		streaming := 0.0
		if s.Lag.Streaming && s.Lag.Error == "" {
			streaming = 1
		}
		ch <- prometheus.MustNewConstMetric(descStreaming, prometheus.GaugeValue, streaming, s.Name)
		if !s.Lag.measured {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descLagBytes, prometheus.GaugeValue, float64(s.Lag.Bytes), s.Name)
		if s.Lag.Seconds != nil {
			ch <- prometheus.MustNewConstMetric(descLagSeconds, prometheus.GaugeValue, *s.Lag.Seconds, s.Name)
		}
	}
}
