package intent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

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

// CheckExceptionIntent says whether an exception from the intent id can exempt anything: only
// from Kyverno's validate rules, the ones its scans report on. namespaced and cluster say whether
// its namespaced and its cluster-wide implementations have Kyverno policies.
func CheckExceptionIntent(name, id string) (ref *Refusal, namespaced, cluster bool) {
	namespaced = slices.Contains(Implementations[id], Kyverno)
	cluster = slices.Contains(ClusterImplementations[id], Kyverno)
	if Scanned[id] == Kyverno {
		return nil, namespaced, cluster
	}
	engines := slices.Concat(Implementations[id], ClusterImplementations[id])
	slices.Sort(engines)
	why := "is enforced by no engine, which has no exception of its own"
	if len(engines) > 0 {
		why = fmt.Sprintf("is enforced by %s, which has no exception of its own", JoinEngines(slices.Compact(engines)))
	}
	if namespaced || cluster {
		why = "has Kyverno policies that mutate or generate rather than validate: there is no check to exempt a workload from"
	}
	return &Refusal{Reason: "NoEngineException", Message: fmt.Sprintf("SecurityIntent %s (%s) %s; leave the workloads out of the bindings' selectors instead", name, id, why)},
		namespaced, cluster
}

// PolicyExceptionKind is Kyverno's exception kind an exception becomes.
var PolicyExceptionKind = schema.GroupVersionKind{Group: "kyverno.io", Version: "v2", Kind: "PolicyException"}

const (
	// ExceptionAnnotation is on each PolicyException written: the namespace/name of the
	// SecurityIntentException it carries (which objects are the controller's to write and delete).
	ExceptionAnnotation = "security.quartermaster.dev/exception"
	// ManagedByLabel marks the PolicyExceptions written, for the sweep of those left behind.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedByValue is ManagedByLabel's value on them.
	ManagedByValue = "quartermaster-intents"
)

// PolicyExceptionName is the name of the PolicyException of the exception namespace/name: the
// two joined by a dot, which no two exceptions share (a namespace has no dot), shortened with a
// hash when longer than a name may be.
func PolicyExceptionName(namespace, name string) string {
	s := namespace + "." + name
	if len(s) <= 253 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return strings.TrimRight(s[:236], ".-") + "-" + hex.EncodeToString(sum[:])[:16]
}

// PolicyException is the Kyverno PolicyException, in namespace, that exc becomes: every rule of
// each of the Kyverno policies named (namespace/name for a Policy, name for a ClusterPolicy), for
// the workloads of the exempted namespaces its selector picks, in background scans too.
func PolicyException(exc *securityv1alpha1.SecurityIntentException, namespace string, policies []string) (*unstructured.Unstructured, error) {
	// Kyverno matches nothing by an empty resource filter: the namespaces are always written ("*"
	// is its wildcard for every namespace).
	resources := map[string]any{"namespaces": AnyList(ExemptedNamespaces(exc))}
	if sel := exc.Spec.Workloads.Selector; len(sel.MatchLabels)+len(sel.MatchExpressions) > 0 {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&sel)
		if err != nil {
			return nil, err
		}
		resources["selector"] = m
	}
	exceptions := make([]any, 0, len(policies))
	for _, p := range policies {
		exceptions = append(exceptions, map[string]any{"policyName": p, "ruleNames": []any{"*"}})
	}
	pe := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"background": true,
			"exceptions": exceptions,
			"match":      map[string]any{"any": []any{map[string]any{"resources": resources}}},
		},
	}}
	pe.SetGroupVersionKind(PolicyExceptionKind)
	pe.SetNamespace(namespace)
	pe.SetName(PolicyExceptionName(exc.Namespace, exc.Name))
	pe.SetLabels(map[string]string{ManagedByLabel: ManagedByValue})
	pe.SetAnnotations(map[string]string{
		ExceptionAnnotation:                  exc.Namespace + "/" + exc.Name,
		"security.quartermaster.dev/owner":   exc.Spec.Owner,
		"security.quartermaster.dev/expires": exc.Spec.Expires.UTC().Format(time.RFC3339),
		"security.quartermaster.dev/intent":  exc.Spec.Intent,
		"security.quartermaster.dev/reason":  exc.Spec.Reason,
	})
	return pe, nil
}
