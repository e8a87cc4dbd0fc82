package status

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Object states in quartermaster_objects.
const (
	StateReady       = "ready"
	StateStalled     = "stalled"
	StateReconciling = "reconciling"
)

var (
	reconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_reconcile_errors_total",
		Help: "Reconciles that ended in a transient error (retried with backoff), by kind and the reason the object's Ready condition shows.",
	}, []string{"kind", "reason"})
	objectsDesc = prometheus.NewDesc("quartermaster_objects",
		"Objects each controller owns, by kind and state (ready, stalled, reconciling), read from the leader's cache at each scrape. Only the leader reports it.",
		[]string{"kind", "state"}, nil)
	objects = &objectCounter{}
)

func init() {
	crmetrics.Registry.MustRegister(reconcileErrors, objects)
}

// countError is called for every outcome a Step concludes or writes in annotations.
func countError(obj runtime.Object, o Outcome) {
	if o.Err != nil {
		reconcileErrors.WithLabelValues(kindOf(obj), o.Reason).Inc()
	}
}

func kindOf(obj runtime.Object) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	return reflect.Indirect(reflect.ValueOf(obj)).Type().Name()
}

// StateOf says which state an object is in; "" leaves it out.
type StateOf func(client.Object) string

// ConditionState reads the state from an object's status.conditions (Stalled, else Ready, else
// reconciling): every Quartermaster kind has them.
func ConditionState(obj client.Object) string {
	conds := ConditionsOf(obj)
	switch {
	case meta.IsStatusConditionTrue(conds, Stalled):
		return StateStalled
	case meta.IsStatusConditionTrue(conds, Ready):
		return StateReady
	}
	return StateReconciling
}

// CountObjects adds a kind to quartermaster_objects: at each scrape, while mgr leads, the objects
// of list's kind in its cache (which the controller watches anyway: no API call), by state. opts
// narrow the list (a namespace, a label).
func CountObjects(mgr ctrl.Manager, kind string, list client.ObjectList, state StateOf, opts ...client.ListOption) {
	objects.add(countedKind{kind: kind, list: list, state: state, opts: opts, reader: mgr.GetCache(), elected: mgr.Elected()})
}

type countedKind struct {
	kind    string
	list    client.ObjectList
	state   StateOf
	opts    []client.ListOption
	reader  client.Reader
	elected <-chan struct{}
}

type objectCounter struct {
	mu    sync.Mutex
	kinds []countedKind
}

func (c *objectCounter) add(k countedKind) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kinds = append(c.kinds, k)
}

func (c *objectCounter) Describe(ch chan<- *prometheus.Desc) { ch <- objectsDesc }

func (c *objectCounter) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	kinds := append([]countedKind(nil), c.kinds...)
	c.mu.Unlock()
	for _, k := range kinds {
		select {
		case <-k.elected:
		default:
			continue // a standby: the leader reports
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		list := k.list.DeepCopyObject().(client.ObjectList)
		err := k.reader.List(ctx, list, k.opts...)
		cancel()
		if err != nil {
			continue // not synced yet: no figure rather than a wrong one
		}
		counts := map[string]int{StateReady: 0, StateStalled: 0, StateReconciling: 0}
		_ = meta.EachListItem(list, func(o runtime.Object) error {
			if s := k.state(o.(client.Object)); s != "" {
				counts[s]++
			}
			return nil
		})
		for state, n := range counts {
			ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(n), k.kind, state)
		}
	}
}
