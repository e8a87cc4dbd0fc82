package intents

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// The impact of an intent on what already runs, read from the engine's own reports.
//
// Kyverno's reports controller scans the existing resources its policies match (background
// scans, at a policy's or a resource's change and every hour) and keeps one PolicyReport
// (wgpolicyk8s.io/v1alpha2, its default reporting group) per resource, in the resource's
// namespace: its scope names the resource, each result names a policy ("namespace/name" for a
// Policy, "name" for a ClusterPolicy), a rule and pass, fail, warn, error or skip. The intents
// controller caches those reports compacted to what it reads (which policies have a result, the
// failed ones with their message) and indexes them by policy, so an intent's or a binding's
// impact is a few index lookups at the reconcile that writes its status anyway: no second
// status writer, and a report that changes only its timestamps wakes nothing.
//
// A report's change wakes the intents and bindings whose policies it names, after
// cluster.AggregateWindow, so a namespace of a thousand Pods scanned at once is a few status writes. What
// the impact cannot be read from (Kyverno's reports not served, its reports controller not
// running) is polled and, when it changes, wakes every intent and binding that
// has scanned intents: the status then says the impact is unknown, never zero. It is read every
// reportsPollInterval: one Lease read (whether the kind is served, the manager's Kinds says).

// impactInputs starts the inputs of an impact with the reports' state, read once per impact.
func (b *base) impactInputs() intent.ImpactInputs {
	st := b.reports.Current()
	return intent.ImpactInputs{Readable: st.Readable, Why: st.Why}
}

// policyFor adds the intent id's scanned policy on the parent (a NimbusPolicy in namespace, or a
// ClusterNimbusPolicy when namespace is ""), as the objects cache holds it.
func (b *base) policyFor(ctx context.Context, in *intent.ImpactInputs, namespace, parent, id string) error {
	engine, ok := intent.Scanned[id]
	if !ok {
		in.AddUnscanned(id)
		return nil
	}
	if engine != intent.Kyverno {
		return fmt.Errorf("intent %s: scanned by %s, which the controller cannot read reports of", id, engine)
	}
	name := intent.PolicyName(parent, id)
	p, gvk, parentKind := intent.KyvernoPolicyOf(namespace, name)
	if !in.Readable {
		// The impact is Unknown, and says why: no need to read the policy.
		in.Policies = append(in.Policies, p)
		return nil
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	err := b.objects.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && cluster.ControllerNamed(obj, parentKind) != parent):
		in.Pending = append(in.Pending, p.Entry) // not written, or someone else's (the policy's status says Conflict)
	case err != nil:
		return err
	default:
		in.Policies = append(in.Policies, p)
	}
	return nil
}

// impact is the status.impact of what in names, from the report cache.
func (b *base) impact(ctx context.Context, in intent.ImpactInputs) (*intentv1alpha1.Impact, error) {
	// The report cache blocks a read until it has synced: bounded, so that a cache that cannot
	// sync (its RBAC, its CRD) shows as an Unknown impact instead of holding the worker.
	ctx, cancel := context.WithTimeout(ctx, cluster.ReadTimeout)
	defer cancel()
	return intent.Impact(in, b.reports.ReportsOf(ctx))
}

// bindingImpact is the impact of a SecurityIntentBinding (namespace set) or a
// ClusterSecurityIntentBinding: the scanned policies of its intents on its (Cluster)NimbusPolicy,
// which has the binding's name.
func (b *base) bindingImpact(ctx context.Context, namespace, name string, names []intentv1alpha1.MatchIntent) (*intentv1alpha1.Impact, error) {
	intents, err := b.intentsOf(ctx, names)
	if err != nil {
		return nil, err
	}
	in := b.impactInputs()
	for _, m := range names {
		si, ok := intents[m.Name]
		if !ok {
			continue
		}
		if err := b.policyFor(ctx, &in, namespace, name, si.Spec.Intent.ID); err != nil {
			return nil, err
		}
	}
	return b.impact(ctx, in)
}

// intentImpact is a SecurityIntent's impact: its scanned policies in every binding naming it.
func (b *base) intentImpact(ctx context.Context, si *intentv1alpha1.SecurityIntent) (*intentv1alpha1.Impact, error) {
	in := b.impactInputs()
	id := si.Spec.Intent.ID
	if _, ok := intent.Scanned[id]; !ok {
		if err := b.policyFor(ctx, &in, "", "", id); err != nil {
			return nil, err
		}
		return b.impact(ctx, in)
	}
	sibs, csibs, err := cluster.BindingsNaming(ctx, b.client, si.Name)
	if err != nil {
		return nil, err
	}
	if len(sibs)+len(csibs) == 0 {
		return &intentv1alpha1.Impact{State: intentv1alpha1.ImpactCurrent, Violations: ptr.To(int32(0)), Scanned: ptr.To(int32(0)),
			Message: "not bound: no workload is checked against it"}, nil
	}
	for _, sib := range sibs {
		if err := b.policyFor(ctx, &in, sib.Namespace, sib.Name, id); err != nil {
			return nil, err
		}
	}
	for _, csib := range csibs {
		if err := b.policyFor(ctx, &in, "", csib.Name, id); err != nil {
			return nil, err
		}
	}
	return b.impact(ctx, in)
}

// The targets of a report for each of the controllers that show what Kyverno's reports say.
func (b *base) reportsForIntents(_ context.Context, _, _ []client.ObjectKey, intents []string) []client.ObjectKey {
	out := make([]client.ObjectKey, 0, len(intents))
	for _, n := range intents {
		out = append(out, client.ObjectKey{Name: n})
	}
	return out
}

func (b *base) reportsForBindings(_ context.Context, sibs, _ []client.ObjectKey, _ []string) []client.ObjectKey {
	return sibs
}

func (b *base) reportsForClusterBindings(_ context.Context, _, csibs []client.ObjectKey, _ []string) []client.ObjectKey {
	return csibs
}

// keepImpact sets *dst to the impact read; one that could not be read is Unknown, with the error
// (the object's own status is not made an error by it; a report or state change reads it again).
func keepImpact(dst **intentv1alpha1.Impact) func(*intentv1alpha1.Impact, error) error {
	return func(i *intentv1alpha1.Impact, err error) error {
		if err != nil {
			i = &intentv1alpha1.Impact{State: intentv1alpha1.ImpactUnknown, Message: "Kyverno's reports could not be read: " + err.Error()}
		}
		*dst = i
		return nil
	}
}
