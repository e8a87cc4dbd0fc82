package intents

import (
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// sources are the watches of the kinds among kinds that the enabled engines generate, one Late
// source each, for a controller of owner (listed by list): an edit or deletion of a generated
// policy reconciles its owner; creations are the owner's own and wake nothing (the reconcile that
// made an object has looked at it, and an informer's replay at start is of owners reconciled at
// start anyway); an engine that appears after the start reconciles every owner, whose policies
// for it can be made now.
func (b *base) engineSources(mgr ctrl.Manager, kinds []schema.GroupVersionKind, owner client.Object, list client.ObjectList) []source.Source {
	var out []source.Source
	for _, en := range []intent.Engine{intent.KubeArmor, intent.NetworkPolicy, intent.Kyverno, intent.K8TLS} {
		if !b.engines.Enabled(en) {
			continue
		}
		woken := false
		for _, gvk := range intent.EngineKinds[en] {
			if !slices.Contains(kinds, gvk) {
				continue
			}
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(gvk)
			late := b.engines.Kinds().Watch(b.engines.Need(en), b.objects, obj,
				handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), owner, handler.OnlyControllerOwner()), notCreated()).
				Prepare(b.engines.Prepare(en))
			if !woken {
				late, woken = late.Appeared(cluster.EnqueueAll(b.client, list, b.log)), true
			}
			out = append(out, late)
		}
	}
	return out
}
