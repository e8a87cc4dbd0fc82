package iam

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
)

// indexPolicies indexes IAMServiceAccounts by the IAMPolicy names in spec.policies.
const indexPolicies = "spec.policies"

// indexSharedRole indexes IAMServiceAccounts by the shared role they name (spec.sharedRole.name).
const indexSharedRole = "spec.sharedRole.name"

// indexReferences indexes IAMServiceAccounts by what they name that other objects change: their
// IAMPolicies and their shared role.
func indexReferences(mgr ctrl.Manager) error {
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &iamv1alpha1.IAMServiceAccount{}, indexPolicies,
		func(o client.Object) []string { return o.(*iamv1alpha1.IAMServiceAccount).Spec.Policies }); err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, &iamv1alpha1.IAMServiceAccount{}, indexSharedRole,
		func(o client.Object) []string {
			if sr := o.(*iamv1alpha1.IAMServiceAccount).Spec.SharedRole; sr != nil {
				return []string{sr.Name}
			}
			return nil
		})
}

// specOrDeletion passes creations, spec changes and the start of deletion.
func specOrDeletion() predicate.Predicate {
	return predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, deletionStarted())
}

func deletionStarted() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil
	}}
}

// patchFinalizer adds or removes the finalizer (with an optimistic lock), leaving the in-memory
// status as it was so the status patch that follows still sees the change.
func (b *base) patchFinalizer(ctx context.Context, obj client.Object, add bool) error {
	if controllerutil.ContainsFinalizer(obj, Finalizer) == add {
		return nil
	}
	orig := obj.DeepCopyObject().(client.Object)
	if add {
		controllerutil.AddFinalizer(obj, Finalizer)
	} else {
		controllerutil.RemoveFinalizer(obj, Finalizer)
	}
	err := b.client.Patch(ctx, obj, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	if !add {
		return client.IgnoreNotFound(err)
	}
	return err
}

// reconcileObject is the skeleton both reconcilers share, for an object just read: deletion
// (which may release the object), or the finalizer then sync; then the status step.
func (b *base) reconcileObject(ctx context.Context, obj client.Object, reported status.Reported,
	deleteObject func() (status.Outcome, bool), sync func() status.Outcome) (reconcile.Result, error) {
	before := obj.DeepCopyObject().(client.Object)
	var o status.Outcome
	if !obj.GetDeletionTimestamp().IsZero() {
		var released bool
		if o, released = deleteObject(); released {
			return o.Result()
		}
	} else if err := b.patchFinalizer(ctx, obj, true); err != nil {
		return reconcile.Result{}, err
	} else {
		o = sync()
	}
	return b.step().End(ctx, obj, before, reported, o)
}
