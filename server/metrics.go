package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgfork/pgfork/pool"
)

// Metrics are the server's Prometheus metrics. It implements pool.Observer.
type Metrics struct {
	wait    *prometheus.HistogramVec
	create  *prometheus.HistogramVec
	failed  *prometheus.CounterVec
	errors  *prometheus.CounterVec
	reg     prometheus.Registerer
	manager *pool.Manager
}

// NewMetrics registers the metrics on reg. Pass it as the Observer of the
// Manager and in Config.Metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg: reg,
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgfork_pool_wait_seconds", Help: "Time a request waited for a test database.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"outcome"}),
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgfork_database_create_seconds", Help: "Time to create (clone) a test database, by strategy.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"strategy"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgfork_database_create_errors_total", Help: "Test database creations that failed.",
		}, []string{"strategy"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgfork_http_errors_total", Help: "API requests answered with an error, by route and status.",
		}, []string{"route", "status"}),
	}
	reg.MustRegister(m.wait, m.create, m.failed, m.errors)
	return m
}

// Waited implements pool.Observer.
func (m *Metrics) Waited(_ string, d time.Duration, ok bool) {
	outcome := "ok"
	if !ok {
		outcome = "timeout"
	}
	m.wait.WithLabelValues(outcome).Observe(d.Seconds())
}

// Created implements pool.Observer.
func (m *Metrics) Created(_ string, strategy string, d time.Duration, err error) {
	if strategy == "" {
		strategy = "unknown"
	}
	if err != nil {
		m.failed.WithLabelValues(strategy).Inc()
		return
	}
	m.create.WithLabelValues(strategy).Observe(d.Seconds())
}

// attach registers the gauges read from the manager at scrape time.
func (m *Metrics) attach(mgr *pool.Manager) {
	if m.manager != nil || mgr == nil {
		return
	}
	m.manager = mgr
	m.reg.MustRegister(&poolCollector{mgr: mgr})
}

type poolCollector struct{ mgr *pool.Manager }

var (
	descDBs = prometheus.NewDesc("pgfork_pool_databases", "Test databases by template and state.",
		[]string{"template", "state"}, nil)
	descWaiters = prometheus.NewDesc("pgfork_pool_waiters", "Requests waiting for a database, by template.",
		[]string{"template"}, nil)
	descTotal = prometheus.NewDesc("pgfork_databases_reserved", "Test databases counted against the global limit.", nil, nil)
	descTpl   = prometheus.NewDesc("pgfork_templates", "Templates known to the server.", nil, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDBs
	ch <- descWaiters
	ch <- descTotal
	ch <- descTpl
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ts, total := c.mgr.Stats()
	for _, t := range ts {
		for _, st := range pool.States {
			ch <- prometheus.MustNewConstMetric(descDBs, prometheus.GaugeValue, float64(t.Pool.ByState[st]), t.Hash, st.String())
		}
		ch <- prometheus.MustNewConstMetric(descWaiters, prometheus.GaugeValue, float64(t.Pool.Waiters), t.Hash)
	}
	ch <- prometheus.MustNewConstMetric(descTotal, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(descTpl, prometheus.GaugeValue, float64(len(ts)))
}
