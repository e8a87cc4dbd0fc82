package namespaces

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

var (
	credentialsIssued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quartermaster_namespace_requests_served_total",
		Help: "Namespace requests served: their first credentials Secret written.",
	})
	tokensRotated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quartermaster_namespace_tokens_rotated_total",
		Help: "Credentials Secrets rewritten with a new token (before it expires, or after a change).",
	})
)

func init() {
	crmetrics.Registry.MustRegister(credentialsIssued, tokensRotated)
}

// requestState is a request ConfigMap's state in quartermaster_objects{kind="NamespaceRequest"}:
// Ready, Invalid or Conflict (stalled: a person must act), anything else reconciling; other
// ConfigMaps of the requests namespace are left out.
func requestState(o client.Object) string {
	if o.GetName() == nsrequest.RootCAConfigMap {
		return ""
	}
	switch nsrequest.Status(o.GetAnnotations()[nsrequest.AnnotationStatus]) {
	case nsrequest.StatusReady:
		return status.StateReady
	case nsrequest.StatusInvalid, nsrequest.StatusConflict:
		return status.StateStalled
	}
	return status.StateReconciling
}
