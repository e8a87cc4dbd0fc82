package namespaces

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/pipelineid"
)

// +kubebuilder:rbac:groups=namespaces.quartermaster.dev,resources=trustedissuers/status,verbs=get;patch

// issuerCheckEvery is how often a TrustedIssuer's discovery document and keys are read again.
const issuerCheckEvery = 10 * time.Minute

// Reasons of a TrustedIssuer's Ready condition.
const (
	ReasonIssuerReady       = "IssuerReady"
	ReasonIssuerUnreachable = "IssuerUnreachable"
	ReasonDuplicateIssuer   = "DuplicateIssuer"
)

// issuerReconciler reports whether each TrustedIssuer's tokens can be verified: its discovery
// document and signing keys read (Ready), before any job's token comes.
type issuerReconciler struct {
	client   client.Client
	step     status.Step
	verifier *pipelineid.Verifier
	// defaults are the operator's namespace defaults, whose profiles the rules name.
	defaults *nsrequest.Defaults
}

func (r *issuerReconciler) setupWithManager(mgr ctrl.Manager) error {
	return builder.ControllerManagedBy(mgr).
		Named("trustedissuer").
		For(&nsv1alpha1.TrustedIssuer{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

func (r *issuerReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ti := &nsv1alpha1.TrustedIssuer{}
	if err := r.client.Get(ctx, req.NamespacedName, ti); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	before := ti.DeepCopy()
	return r.step.End(ctx, ti, before, status.Reported{Conditions: &ti.Status.Conditions, ObservedGeneration: &ti.Status.ObservedGeneration}, r.check(ctx, ti))
}

// precedes says whether TrustedIssuer a decides over b when both name one issuer: the older, and
// of two made in the same second (creationTimestamp's resolution), the first by name. The one
// rule the exchange and the status both follow.
func precedes(a, b *nsv1alpha1.TrustedIssuer) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// check says whether ti's tokens can be verified now.
func (r *issuerReconciler) check(ctx context.Context, ti *nsv1alpha1.TrustedIssuer) status.Outcome {
	var all nsv1alpha1.TrustedIssuerList
	if err := r.client.List(ctx, &all); err != nil {
		return status.Transient(ReasonIssuerUnreachable, err.Error(), err)
	}
	for _, other := range all.Items {
		// The exchange picks the first with the token's iss: two would make the choice arbitrary.
		if other.Name != ti.Name && other.Spec.IssuerURL == ti.Spec.IssuerURL && precedes(&other, ti) {
			return status.WaitsForPerson(ReasonDuplicateIssuer, fmt.Sprintf(
				"TrustedIssuer %s already names issuer %s; its rules decide, this one is ignored: merge the rules into one", other.Name, ti.Spec.IssuerURL), issuerCheckEvery)
		}
	}
	for _, rule := range ti.Spec.Rules {
		if err := pipelineid.ValidateTemplate(rule.Namespace); err != nil {
			return status.WaitsForPerson("InvalidRule", fmt.Sprintf("rule %s: %v", rule.Name, err), issuerCheckEvery)
		}
		if _, err := r.defaults.ProfileNamed(rule.Defaults); err != nil {
			return status.WaitsForPerson(ReasonUnknownDefaults, fmt.Sprintf("rule %s: %v; the exchange refuses its jobs until the operator's defaults file defines it", rule.Name, err), issuerCheckEvery)
		}
	}
	keys, err := r.verifier.Check(ctx, ti.Spec.IssuerURL)
	if err != nil {
		return status.Transient(ReasonIssuerUnreachable, fmt.Sprintf("tokens of %s cannot be verified: %v", ti.Spec.IssuerURL, err), err)
	}
	return status.Healthy(ReasonIssuerReady, fmt.Sprintf("%d signing keys published; jobs exchange tokens with audience %s at %s", keys, ti.Spec.Audience, "/v1/exchange"), issuerCheckEvery)
}
