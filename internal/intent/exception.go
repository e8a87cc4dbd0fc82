package intent

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
)

// ExceptionRules are what the platform allows of SecurityIntentExceptions (the manager's
// --intents-exception-* flags).
type ExceptionRules struct {
	// Namespace is where Kyverno accepts PolicyExceptions (its --exceptionNamespace); "":
	// exceptions are refused.
	Namespace string
	// MaxTTL is how long after its creation an exception may end at the latest.
	MaxTTL time.Duration
	// Warning is how long before its expiry an exception says it expires soon.
	Warning time.Duration
	// AdminNamespaces are the namespaces whose exceptions may exempt workloads of other
	// namespaces (named, or "*" for every namespace, in the exception).
	AdminNamespaces []string
	// AllowEverything lets an admin namespace's exception exempt every workload of every
	// namespace (namespaces ["*"] with an empty selector).
	AllowEverything bool
}

// Refusal is a check an exception failed: nothing is exempted, and what was is no longer. Reason
// is its Ready condition's reason, Message says which check failed and what the platform allows.
type Refusal struct{ Reason, Message string }

// CheckException is every check of an exception that needs no other object, in order: the first
// failed one, or nil. now is the controller's clock.
func CheckException(exc *securityv1alpha1.SecurityIntentException, o ExceptionRules, now time.Time) *Refusal {
	spec := exc.Spec
	if o.Namespace == "" {
		return &Refusal{Reason: "ExceptionsDisabled", Message: "the platform has not enabled exceptions: the manager's --intents-exception-namespace " +
			"(chart intents.exceptions.namespace) names the namespace where Kyverno accepts PolicyExceptions"}
	}
	if !spec.Expires.After(now) {
		return &Refusal{Reason: "Expired", Message: fmt.Sprintf("expired at %s (owner %s): the workloads are subject to SecurityIntent %s again; "+
			"a later spec.expires (within --intents-exception-max-ttl of the exception's creation, %s) or a new exception exempts them anew",
			spec.Expires.UTC().Format(time.RFC3339), spec.Owner, spec.Intent, exc.CreationTimestamp.Add(o.MaxTTL).UTC().Format(time.RFC3339))}
	}
	if latest := exc.CreationTimestamp.Add(o.MaxTTL); spec.Expires.After(latest) {
		return &Refusal{Reason: "ExpiryBeyondMaximum", Message: fmt.Sprintf("spec.expires %s is later than the platform allows: at most %s after the exception's creation, %s (--intents-exception-max-ttl)",
			spec.Expires.UTC().Format(time.RFC3339), o.MaxTTL, latest.UTC().Format(time.RFC3339))}
	}
	namespaces := ExemptedNamespaces(exc)
	if slices.ContainsFunc(namespaces, func(ns string) bool { return ns != exc.Namespace }) && !slices.Contains(o.AdminNamespaces, exc.Namespace) {
		allowed := "no namespace"
		if len(o.AdminNamespaces) > 0 {
			allowed = "only " + strings.Join(o.AdminNamespaces, ", ")
		}
		return &Refusal{Reason: "NamespaceNotAllowed", Message: fmt.Sprintf("spec.workloads.namespaces %v: an exception in %s exempts only workloads of %s; "+
			"exceptions for other namespaces are made in a namespace the platform names (%s, --intents-exception-admin-namespaces)",
			namespaces, exc.Namespace, exc.Namespace, allowed)}
	}
	if _, err := metav1.LabelSelectorAsSelector(&spec.Workloads.Selector); err != nil {
		return &Refusal{Reason: "InvalidSelector", Message: "spec.workloads.selector: " + err.Error()}
	}
	if slices.Contains(namespaces, "*") && selectsByAbsence(spec.Workloads.Selector) && !o.AllowEverything {
		return &Refusal{Reason: "ExemptsEverything", Message: "spec.workloads: namespaces [\"*\"] with a selector that requires no label (empty, or only NotIn and DoesNotExist) " +
			"exempts nearly every workload of the cluster, which the platform does not allow (--intents-exception-allow-everything); " +
			"name the namespaces or select the workloads by a label they have"}
	}
	return nil
}

// selectsByAbsence reports a selector that requires no label to be present: empty, or only NotIn
// and DoesNotExist (which every workload without the label matches).
func selectsByAbsence(sel metav1.LabelSelector) bool {
	if len(sel.MatchLabels) > 0 {
		return false
	}
	for _, r := range sel.MatchExpressions {
		if r.Operator == metav1.LabelSelectorOpIn || r.Operator == metav1.LabelSelectorOpExists {
			return false
		}
	}
	return true
}

// ExemptedNamespaces are the namespaces the exception exempts workloads of ("*": all).
func ExemptedNamespaces(exc *securityv1alpha1.SecurityIntentException) []string {
	if len(exc.Spec.Workloads.Namespaces) == 0 {
		return []string{exc.Namespace}
	}
	return exc.Spec.Workloads.Namespaces
}
