package intents

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// applyPolicies creates the generated policies that are missing, reverts the ones edited by hand,
// and deletes the parent's policies that are no longer generated (of the given kinds, in
// namespace, "" for cluster-scoped). An object it does not control is left alone and reported.
//
// made is the parent's status.adapterPolicies, read through the guarded client, so never older
// than our own last write of it: a policy it lists that the cache does not show is one the cache
// has not seen yet (or someone deleted since), and the API server is asked before creating it,
// rather than repeating the create for a refusal.
func (b *base) applyPolicies(ctx context.Context, parent types.UID, desired []intent.Policy, made []string, namespace string, kinds []schema.GroupVersionKind) (intent.Applied, error) {
	a, present, wanted := b.sortOut(desired)
	// The policies are independent objects: written at once, reported in order. One that fails
	// does not hold back the others, nor the deletions below.
	results := make([]policyResult, len(present))
	var g errgroup.Group
	g.SetLimit(policyWriters)
	for i, p := range present {
		g.Go(func() error {
			results[i] = b.applyPolicy(ctx, p, p.Entry != "" && slices.Contains(made, p.Entry))
			return nil
		})
	}
	_ = g.Wait()
	var transient error
	for i, r := range results {
		switch {
		case r.err != nil && owned.Rejected(r.err):
			a.Rejected = append(a.Rejected, fmt.Sprintf("%s: %s", present[i].Entry, r.err))
		case r.err != nil:
			transient = cmp.Or(transient, fmt.Errorf("%s: %w", present[i].Entry, r.err))
		case r.skipped:
		case !r.controlled:
			a.Conflicts = append(a.Conflicts, r.conflict)
		case present[i].Entry != "":
			a.Entries = append(a.Entries, present[i].Entry)
			if !r.inForce {
				a.Pending = append(a.Pending, present[i].Entry+" ("+r.reason+")")
			}
		}
		if r.change != "" {
			a.Changes = append(a.Changes, r.change)
		}
	}
	if err := b.deleteUnwanted(ctx, parent, wanted, namespace, kinds, &a); err != nil {
		return a, cmp.Or(transient, err)
	}
	return a, transient
}

// sortOut picks, of the desired policies, those to write: not of an engine disabled or not
// installed (noted in a), nor made already by an earlier rule of the same id. wanted are their
// names by kind.
func (b *base) sortOut(desired []intent.Policy) (a intent.Applied, present []intent.Policy, wanted map[schema.GroupVersionKind]map[string]bool) {
	wanted = map[schema.GroupVersionKind]map[string]bool{}
	for _, p := range desired {
		if !b.engines.Enabled(p.Engine) {
			if !slices.Contains(a.Disabled, p.Engine) {
				a.Disabled = append(a.Disabled, p.Engine)
			}
			continue
		}
		if !b.engines.Has(p.Engine) {
			if !slices.Contains(a.Missing, p.Engine) {
				a.Missing = append(a.Missing, p.Engine)
			}
			continue
		}
		gvk := p.Object.GroupVersionKind()
		if wanted[gvk] == nil {
			wanted[gvk] = map[string]bool{}
		}
		if wanted[gvk][p.Object.GetName()] {
			// Two rules of one id (the same intent twice, or Block and Audit of it): the first
			// rule's policy is made, or the two would overwrite each other for ever.
			a.Shadowed = append(a.Shadowed, p.Entry)
			continue
		}
		wanted[gvk][p.Object.GetName()] = true
		present = append(present, p)
	}
	return a, present, wanted
}

// deleteUnwanted deletes the parent's policies of the kinds (in namespace) that are not wanted,
// noting each in a.Changes.
func (b *base) deleteUnwanted(ctx context.Context, parent types.UID, wanted map[schema.GroupVersionKind]map[string]bool, namespace string, kinds []schema.GroupVersionKind, a *intent.Applied) error {
	for _, gvk := range kinds {
		if !b.engines.Has(engineOf(gvk)) || !b.engines.Enabled(engineOf(gvk)) {
			continue // a disabled engine's objects are left alone, as it is not watched
		}
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		in := namespace
		if engineOf(gvk) == intent.K8TLS {
			in = intent.K8TLSNamespace // whoever owns them, they are there
		}
		// The parent's own only (an index), not every policy of the namespace.
		if err := b.objects.List(ctx, list, client.InNamespace(in), client.MatchingFields{cluster.IndexController: string(parent)}); err != nil {
			return err
		}
		for i := range list.Items {
			obj := &list.Items[i]
			ref := metav1.GetControllerOf(obj)
			if ref == nil || ref.UID != parent || wanted[gvk][obj.GetName()] || !strings.HasPrefix(obj.GetAnnotations()[intent.ManagedBy], "nimbus-") {
				continue
			}
			if err := b.client.Delete(ctx, obj, client.Preconditions{UID: new(obj.GetUID())}); client.IgnoreNotFound(err) != nil {
				return err
			}
			a.Changes = append(a.Changes, "deleted "+gvk.Kind+" "+obj.GetName())
		}
	}
	return nil
}

// policyWriters bounds the writes one reconcile makes at once.
const policyWriters = 8

// policyResult is what applying one generated policy found and did.
type policyResult struct {
	skipped    bool   // its namespace is being deleted: nothing to make there
	controlled bool   // the object is the parent's (false: conflict names what is in the way)
	conflict   string // the object in the way
	change     string // created or reverted, for the Event
	inForce    bool   // its engine has taken it in
	reason     string // the engine's words when it has not
	err        error
}

// applyPolicy brings one generated policy about; made says the parent's status lists it.
func (b *base) applyPolicy(ctx context.Context, p intent.Policy, made bool) policyResult {
	did, stored, err := b.policies().Ensure(ctx, p.Object.DeepCopy(), owned.Options{Made: made})
	inForce, reason := false, ""
	if u, ok := stored.(*unstructured.Unstructured); ok {
		inForce, reason = intent.InForce(u)
	}
	switch {
	case err != nil:
		return policyResult{err: err}
	case did == owned.Terminating:
		return policyResult{skipped: true}
	case did == owned.Taken:
		return policyResult{conflict: p.Object.GetKind() + " " + client.ObjectKeyFromObject(p.Object).String()}
	case did == owned.Updated, did == owned.Reverted, did == owned.Created:
		return policyResult{controlled: true, inForce: inForce, reason: reason, change: string(did) + " " + p.Object.GetKind() + " " + p.Object.GetName()}
	}
	return policyResult{controlled: true, inForce: inForce, reason: reason}
}

func engineOf(gvk schema.GroupVersionKind) intent.Engine {
	for e, kinds := range intent.EngineKinds {
		if slices.Contains(kinds, gvk) {
			return e
		}
	}
	return ""
}
