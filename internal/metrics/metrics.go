// Package metrics holds the Prometheus metrics several controllers share, registered in
// controller-runtime's registry (served on the manager's /metrics). docs/metrics.md lists every
// family Quartermaster exports and the alerts built on them.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Result labels of external calls besides a service's own error codes.
const (
	ResultOK    = "ok"
	ResultError = "error" // no answer: a network error, a timeout, a cancelled context
)

var (
	externalCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_external_requests_total",
		Help: "Calls to outside services (AWS IAM, STS and EKS, vSphere) by service, operation and result: ok, the service's error code or fault, or error when there was no answer. An AWS call counts once with its retries.",
	}, []string{"service", "operation", "result"})
	externalLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "quartermaster_external_request_duration_seconds",
		Help:    "How long calls to outside services took, by service and operation (AWS: with retries).",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"service", "operation"})
)

func init() {
	crmetrics.Registry.MustRegister(externalCalls, externalLatency)
}

// ObserveExternal records one call to an outside service that started at start.
func ObserveExternal(service, operation, result string, start time.Time) {
	externalCalls.WithLabelValues(service, operation, result).Inc()
	externalLatency.WithLabelValues(service, operation).Observe(time.Since(start).Seconds())
}
