package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// EngineRecheck is how often a policy waiting for an engine looks again, besides being woken when
// the engine is detected.
const EngineRecheck = 5 * time.Minute

// ConflictRetry is how often a policy blocked by an object it does not control looks again.
const ConflictRetry = 5 * time.Minute

// EnqueueAll adds every object of list's kind (read from c) to a controller's queue: a source's
// Appeared, for what waited for an engine.
func EnqueueAll(c client.Reader, list client.ObjectList, log logr.Logger) func(ctx context.Context, q controllers.Queue) {
	return func(ctx context.Context, q controllers.Queue) {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := c.List(ctx, l); err != nil {
			log.Error(err, "reconciling every object after an engine appeared: listing failed; each is reconciled at its recheck", "kind", fmt.Sprintf("%T", list))
			return
		}
		_ = ForEach(l, func(o client.Object) { q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)}) })
	}
}

// Scanned are the keys of the objects of list's kind that name a scanned intent, by the index
// field (none: the SecurityIntents themselves), whose impacts a change of the reports' state
// changes.
func Scanned(c client.Reader, list client.ObjectList, field string) func(ctx context.Context) ([]client.ObjectKey, error) {
	return func(ctx context.Context) ([]client.ObjectKey, error) {
		intents := &intentv1alpha1.SecurityIntentList{}
		if err := c.List(ctx, intents, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		var out []client.ObjectKey
		for i := range intents.Items {
			s := &intents.Items[i]
			if _, ok := intent.Scanned[s.Spec.Intent.ID]; !ok {
				continue
			}
			if field == "" {
				out = append(out, client.ObjectKeyFromObject(s))
				continue
			}
			l := list.DeepCopyObject().(client.ObjectList)
			if err := c.List(ctx, l, client.MatchingFields{field: s.Name}, client.UnsafeDisableDeepCopy); err != nil {
				return nil, err
			}
			_ = ForEach(l, func(o client.Object) { out = append(out, client.ObjectKeyFromObject(o)) })
		}
		return out, nil
	}
}

// ForEach calls f with each object of list.
func ForEach(list client.ObjectList, f func(client.Object)) error {
	return meta.EachListItem(list, func(o runtime.Object) error {
		f(o.(client.Object))
		return nil
	})
}
